"""RabbitMQ's Java stream client (tests/compat/java) against a riverlog server with TLS, users
and authorization (an App in this process, RabbitMQ Stream door only): the client over TLS
trusting the test's CA, and the errors it reports for bad input, each compared with what
RabbitMQ answers (rabbit_stream_reader: 0x02 stream does not exist, 0x08 authentication
failure, 0x10 access refused for Create/Delete without configure, DeclarePublisher without
write, Subscribe and StreamStats without read). The client never sends a frame larger than
the negotiated frame_max: it refuses such a message itself (the server's own 0x0e for
oversized frames is tested over raw sockets in test_bad_input.py)."""
from __future__ import annotations

import os
import sys

import pytest

from riverlog.config import RabbitStreamConfig, SecurityConfig, ServerConfig, TlsConfig
from riverlog.security.users import hash_password
from riverlog.server.app import App

from ._helpers import stream_name

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "security"))
from _certs import Authority  # noqa: E402  (the test CA of tests/security)

pytestmark = pytest.mark.timeout(120)

PASSWORDS = {"admin": "admin-pw", "writer": "writer-pw", "reader": "reader-pw"}
# admin does everything; writer publishes to orders.*; reader consumes orders.* and does
# everything on reader.*
RULES = (("p", "admin", "*", "*"), ("p", "writer", "orders.*", "publish"),
         ("p", "reader", "orders.*", "consume"), ("p", "reader", "reader.*", "*"))
ACCESS_REFUSED, STREAM_DOES_NOT_EXIST = 0x10, 0x02


@pytest.fixture
async def secured(tmp_path):
    """(App, CA file): TLS on a second port with a certificate for localhost/127.0.0.1 from
    a CA made for the test, the users of PASSWORDS (bcrypt), authorization by RULES."""
    ca = Authority(str(tmp_path))
    cert = ca.issue("localhost", server=True)
    users = tuple((name, hash_password(pw, rounds=4)) for name, pw in PASSWORDS.items())
    app = App(ServerConfig(
        data_dir=str(tmp_path / "data"),
        rabbitmq_stream=RabbitStreamConfig(port=0, tls_port=0, silent_close_delay_ms=0),
        nats=None, grpc=None, metrics=None,
        security=SecurityConfig(users=users, tls=TlsConfig(cert.cert, cert.key, ca.pem, False),
                                authz=True, authz_rules=RULES)))
    await app.start()
    try:
        yield app, ca.pem
    finally:
        await app.stop()


async def test_tls_with_the_test_ca(secured, java_client):
    app, ca = secured
    port = app.rabbitmq_stream.tls_port
    r = await java_client.run("tls", "127.0.0.1", port, username="admin",
                              password=PASSWORDS["admin"], tls_ca=ca,
                              stream=stream_name("java-tls"))
    assert r["confirmed"] == 20
    assert r["bodies"] == [f"m-{i}" for i in range(20)]
    # Open and Metadata name the TLS port to a TLS client: every connection went there
    assert r["addresses"] and set(r["addresses"]) == {f"127.0.0.1:{port}"}
    # a client that does not trust the CA gets no connection: its TLS handshakes fail on
    # the certificate (the error build() reports may instead be the closed channel its
    # first write met, a race inside the client, so the handshakes are recorded apart)
    assert r["untrusted"].get("ok") is not True, r["untrusted"]
    handshakes = r["untrusted_handshakes"]
    assert handshakes and all("SSLHandshakeException" in h for h in handshakes), handshakes


async def test_bad_input_gets_rabbitmqs_errors(secured, java_client):
    app, _ = secured
    stream = stream_name("orders.java")
    r = await java_client.run("bad_input", "127.0.0.1", app.rabbitmq_stream.port,
                              users=PASSWORDS, stream=stream)
    # a wrong password or an unknown user: 0x08, the environment is not built
    assert r["wrong_password"]["error"] == "AuthenticationFailureException", r["wrong_password"]
    assert r["unknown_user"]["error"] == "AuthenticationFailureException", r["unknown_user"]
    # an unknown stream: 0x02 on Metadata (producer, consumer), StreamStats and Delete
    assert r["unknown_producer"]["error"] == "StreamDoesNotExistException"
    assert r["unknown_consumer"]["error"] == "StreamDoesNotExistException"
    assert r["unknown_stats"]["code"] == STREAM_DOES_NOT_EXIST
    assert r["unknown_delete"]["code"] == STREAM_DOES_NOT_EXIST
    assert r["unknown_exists"] is False
    # no permission: 0x10, and what is permitted works
    for refused in ("writer_create", "writer_consume", "writer_delete", "writer_stats",
                    "reader_publish"):
        assert r[refused].get("code") == ACCESS_REFUSED, (refused, r[refused])
    assert r["writer_publish"] == {"ok": True, "value": {"confirmed": 1, "failed_codes": []}}
    assert r["reader_consume"]["ok"] is True
    assert r["reader_consume"]["value"]["bodies"] == [f"m-{i}" for i in range(10)] + ["w-0"]
    assert r["reader_create_own"] == {"ok": True, "value": ""}
    assert r["reader_delete_own"] == {"ok": True, "value": ""}
    # frame_max: riverlog proposes RabbitMQ's 1,048,576 bytes; a bigger message is refused by
    # the client before it is sent, one that fits is stored and delivered whole
    assert r["too_large"].get("ok") is not True, r["too_large"]
    assert r["fits"] == {"ok": True, "value": {"confirmed": 1, "failed_codes": []}}
    assert r["after_large"] == [3, 1_000_000]
