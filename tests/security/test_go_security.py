# RabbitMQ's Go stream client (the `go_client` fixture, tests/compat/_go.py) against a riverlog
# App with users, authorization and TLS (_sec.py; certificates made in tmp_path): the TLS
# listener, a refused login, and each call of a user without the permission it needs answered
# with the code RabbitMQ's rabbit_stream_reader sends (access refused 0x10: configure for
# Create/Delete, write for DeclarePublisher, read for Subscribe, QueryOffset,
# QueryPublisherSequence and StreamStats).
from __future__ import annotations

import pytest

from _sec import PASSWORDS, running, security

pytestmark = pytest.mark.timeout(120)

OK, NO_OFFSET, AUTHENTICATION_FAILURE, ACCESS_REFUSED = 0x01, 0x13, 0x08, 0x10


def login(user: str, password: str | None = None) -> dict:
    return {"username": user, "password": PASSWORDS.get(user, "") if password is None
            else password}


async def test_go_client_over_tls(tmp_path, users, pki, go_client):
    """Publish and consume over TLS (PLAIN), a refused login, SASL EXTERNAL."""
    async with running(tmp_path, security(users, pki), liftbridge=False) as app:
        port = app.rabbitmq_stream.tls_port
        r = await go_client.run("publish_consume", "127.0.0.1", port, tls_ca=pki.ca,
                                stream="orders.tls", count=20, batch=5, **login("ops"))
        assert (r["confirmed"], r["failed"]) == (25, 0)
        assert r["bodies"] == [f"s-{i}" for i in range(20)] + [f"b-{i}" for i in range(5)]
        # Metadata on a TLS connection names the TLS listener: the producer went there
        assert r["leader"].endswith(f":{port}")
        r = await go_client.run("login", "127.0.0.1", port, tls_ca=pki.ca,
                                **login("alice", "wrong"))
        assert r["code"] == AUTHENTICATION_FAILURE
        # SASL EXTERNAL: alice's client certificate makes her alice (her permissions apply)
        alice = {"tls_ca": pki.ca, "tls_cert": pki.alice.cert, "tls_key": pki.alice.key,
                 "sasl": "EXTERNAL", "username": "ignored", "password": "ignored"}
        r = await go_client.run("permissions", "127.0.0.1", port, stream="orders.tls",
                                **alice)
        assert (r["new_producer"], r["send"], r["confirmed"]) == (OK, OK, 1)
        assert r["declare"] == r["new_consumer"] == ACCESS_REFUSED
        # no client certificate: the server offers no EXTERNAL, the client finds no mechanism
        r = await go_client.run("login", "127.0.0.1", port, **{**alice, "tls_cert": ""})
        assert r["code"] == -1 and r["error"] == "no matching mechanism found"


async def test_go_client_without_permission(tmp_path, users, go_client):
    """alice may publish to orders.*, bob consume orders.*, ops (admin) everything."""
    async with running(tmp_path, security(users), liftbridge=False) as app:
        port = app.rabbitmq_stream.port
        r = await go_client.run("publish_consume", "127.0.0.1", port, stream="orders.eu",
                                count=3, batch=1, **login("ops"))
        assert r["confirmed"] == 4
        alice = await go_client.run("permissions", "127.0.0.1", port, stream="orders.eu",
                                    **login("alice"))
        assert alice == {"declare": ACCESS_REFUSED, "new_producer": OK, "send": OK,
                         "confirmed": 1, "new_named_producer": ACCESS_REFUSED,
                         "query_sequence": ACCESS_REFUSED, "new_consumer": ACCESS_REFUSED,
                         "query_offset": ACCESS_REFUSED, "delete": ACCESS_REFUSED,
                         "stream_stats": ACCESS_REFUSED}
        bob = await go_client.run("permissions", "127.0.0.1", port, stream="orders.eu",
                                  expect=5, **login("bob"))
        assert bob == {"declare": ACCESS_REFUSED, "new_producer": ACCESS_REFUSED,
                       "new_named_producer": ACCESS_REFUSED, "query_sequence": OK,
                       "new_consumer": OK, "received": 5, "query_offset": NO_OFFSET,
                       "delete": ACCESS_REFUSED, "stream_stats": OK}
        assert app.broker.streams["orders.eu"].partitions[0].next_offset == 5
        r = await go_client.run("login", "127.0.0.1", port, username="guest",
                                password="guest")  # not a user once users are configured
        assert r["code"] == AUTHENTICATION_FAILURE
