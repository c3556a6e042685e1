# riverlog's own client over TLS: the `riverlog stream|publish|tail` commands (real
# subprocesses) and riverlog.client against a server whose RabbitMQ Stream TLS listener and
# TLS-only gRPC port are the doors used; the CA, client certificate and server name options;
# every refusal is one clear line and exit code 1.
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from _sec import running, security
from riverlog.client import AsyncClient, ClientError
from riverlog.security.tls import ClientTLS

pytestmark = pytest.mark.timeout(180)


async def riverlog(*args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    """Run `python -m riverlog ARGS` while this test's event loop keeps serving."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "riverlog", *args, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    return proc.returncode, out.decode(), err.decode()


def doors(app, user: str = "ops", password: str = "ops-pw") -> list[str]:
    """The target options naming only the TLS doors of ``app``."""
    return ["--server", f"127.0.0.1:{app.rabbitmq_stream.tls_port}",
            "--grpc", f"127.0.0.1:{app.grpc.port}", "--user", user, "--password", password,
            "--timeout", "5"]


def refused(result: tuple[int, str, str], *words: str) -> bool:
    """Exit code 1 and one error line on stderr containing every word."""
    code, _, err = result
    lines = err.strip().splitlines()
    return code == 1 and len(lines) == 1 and all(w in lines[0] for w in words)


async def test_cli_commands_over_tls(tmp_path, users, pki):
    async with running(tmp_path, security(users, pki)) as app:
        tls = doors(app) + ["--tls-ca", pki.ca]
        code, out, err = await riverlog("stream", "create", "orders.tls", *tls)
        assert (code, out.strip()) == (0, "created stream orders.tls"), err
        code, _, err = await riverlog("publish", "orders.tls", "one", "two", "three", *tls)
        assert code == 0 and "published 3 message(s)" in err, err
        code, out, err = await riverlog("tail", "orders.tls", "-n", "3", *tls)
        assert (code, out.splitlines()) == (0, ["one", "two", "three"]), err
        # stream list asks the TLS-only gRPC door, with the user and password
        code, out, err = await riverlog("stream", "list", *tls)
        assert code == 0 and "orders.tls" in out, err
        code, out, err = await riverlog("stream", "describe", "orders.tls", *tls)
        assert code == 0 and "orders.tls" in out, err

        # the name checked is the host given, or --tls-server-name
        by_name = doors(app) + ["--tls-ca", pki.ca, "--tls-server-name", "localhost"]
        code, out, err = await riverlog("tail", "orders.tls", "-n", "1", *by_name)
        assert (code, out.splitlines()) == (0, ["one"]), err
        code, out, err = await riverlog("stream", "list", *by_name)
        assert code == 0 and "orders.tls" in out, err
        wrong = doors(app) + ["--tls-ca", pki.ca, "--tls-server-name", "riverlog.example"]
        assert refused(await riverlog("tail", "orders.tls", "-n", "1", *wrong),
                       "over TLS", "riverlog.example")
        assert refused(await riverlog("stream", "list", *wrong), "UNAVAILABLE")

        # without the CA (the system's trust store does not know it), or without TLS
        assert refused(await riverlog("tail", "orders.tls", "-n", "1", "--tls", *doors(app)),
                       "over TLS", "CERTIFICATE_VERIFY_FAILED")
        assert refused(await riverlog("tail", "orders.tls", "-n", "1", *doors(app)),
                       f"127.0.0.1:{app.rabbitmq_stream.tls_port}")
        code, _, err = await riverlog("tail", "orders.tls", "--tls-ca",
                                      str(tmp_path / "missing.pem"), *doors(app))
        assert code == 2 and "missing.pem" in err and "does not exist" in err, err
        assert refused(await riverlog("tail", "orders.tls", "--tls-ca", pki.alice.key,
                                      *doors(app)), "TLS settings", pki.alice.key)
        assert refused(await riverlog("tail", "orders.tls", "--tls-ca", pki.ca, "--tls-cert",
                                      pki.alice.cert, *doors(app)),
                       "certificate and its key")


async def test_cli_and_client_with_a_client_certificate(tmp_path, users, pki):
    """With client certificates required, the --tls-cert/--tls-key pair gets in (then PLAIN
    names the user); without it the TLS handshake is refused, on both doors."""
    async with running(tmp_path, security(users, pki, client_auth=True)) as app:
        cert = ["--tls-ca", pki.ca, "--tls-cert", pki.alice.cert, "--tls-key", pki.alice.key]
        code, _, err = await riverlog("stream", "create", "orders.cert", *doors(app), *cert)
        assert code == 0, err
        code, _, err = await riverlog("publish", "orders.cert", *doors(app, "alice", "alice-pw"),
                                      *cert, stdin=b"a\nb\n")
        assert code == 0 and "published 2 message(s)" in err, err
        code, out, err = await riverlog("stream", "list", *doors(app, "alice", "alice-pw"), *cert)
        assert code == 0 and "orders.cert" in out, err
        code, out, err = await riverlog("tail", "orders.cert", "-n", "2", *doors(app), *cert)
        assert (code, out.splitlines()) == (0, ["a", "b"]), err

        no_cert = doors(app) + ["--tls-ca", pki.ca]
        code, out, err = await riverlog("tail", "orders.cert", "-n", "2", *no_cert)
        assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, err
        assert refused(await riverlog("stream", "list", *no_cert), "UNAVAILABLE")

        # the library the Spark executors use: same settings, same answers
        client = await AsyncClient.connect(
            "127.0.0.1", app.rabbitmq_stream.tls_port, "bob", "bob-pw", timeout=5,
            tls=ClientTLS(pki.ca, pki.alice.cert, pki.alice.key))
        try:
            assert await client.offset_range("orders.cert") == (0, 2)
        finally:
            await client.close()
        with pytest.raises(ClientError):
            await AsyncClient.connect("127.0.0.1", app.rabbitmq_stream.tls_port, "bob",
                                      "bob-pw", timeout=5, tls=ClientTLS(pki.ca))


async def test_cli_logs_in_as_the_client_certificate(tmp_path, users, pki):
    """--sasl-mechanism EXTERNAL: dave, a certificate-only user, logs in on the RabbitMQ
    Stream door by his certificate's CN (no password sent) and is named by it on gRPC."""
    async with running(tmp_path, security(users, pki, authz=False, client_auth=True)) as app:
        dave = ["--server", f"127.0.0.1:{app.rabbitmq_stream.tls_port}",
                "--grpc", f"127.0.0.1:{app.grpc.port}", "--timeout", "5", "--tls-ca", pki.ca,
                "--sasl-mechanism", "EXTERNAL"]
        cert = ["--tls-cert", pki.dave.cert, "--tls-key", pki.dave.key]
        code, _, err = await riverlog("stream", "create", "dave.s", *dave, *cert)
        assert code == 0, err
        code, _, err = await riverlog("publish", "dave.s", "x", *dave, *cert)
        assert code == 0 and "published 1 message(s)" in err, err
        code, out, err = await riverlog("tail", "dave.s", "-n", "1", *dave, *cert)
        assert (code, out.splitlines()) == (0, ["x"]), err
        code, out, err = await riverlog("stream", "list", *dave, *cert)
        assert code == 0 and "dave.s" in out, err
        # a certificate whose CN is no user: refused by the door
        carol = ["--tls-cert", pki.carol.cert, "--tls-key", pki.carol.key]
        assert refused(await riverlog("tail", "dave.s", *dave, *carol), "0x08")
        # EXTERNAL is offered only with a verified client certificate
        client_auth_off = security(users, pki, authz=False)
    async with running(tmp_path / "plain", client_auth_off) as app:
        assert refused(await riverlog(
            "tail", "dave.s", "--server", f"127.0.0.1:{app.rabbitmq_stream.tls_port}",
            "--tls-ca", pki.ca, "--sasl-mechanism", "EXTERNAL"), "offers SASL PLAIN, not EXTERNAL")
