# A Spark batch read over TLS: the `tls.*` options reach the driver's planning connection and
# every executor's, against the door's TLS listener (certificates from tests/security).
from __future__ import annotations

import pytest

from riverlog.client import Client, ClientError
from riverlog.config import SecurityConfig, TlsConfig
from riverlog.security.tls import ClientTLS
from security._certs import Authority

from ._server import ThreadServer
from .conftest import publish, reader, record


@pytest.fixture
def tls_server(tmp_path):
    ca = Authority(str(tmp_path))
    pem = ca.issue("localhost", server=True)
    server = ThreadServer(str(tmp_path / "data"),
                          SecurityConfig(tls=TlsConfig(pem.cert, pem.key))).start()
    yield server, ca.pem
    server.stop()


def test_batch_read_over_tls(spark, tls_server):
    server, ca = tls_server
    port = server.app.rabbitmq_stream.tls_port
    with Client("127.0.0.1", port, tls=ClientTLS(ca)) as c:
        c.create_stream("tls-read")
        publish(c, "tls-read", [record(i) for i in range(30)], batch=10)
    df = reader(spark, f"127.0.0.1:{port}", "tls-read", minPartitions=3,
                **{"tls.ca": ca, "tls.serverName": "localhost"}).load()
    assert sorted((r.offset, r.value) for r in df.select("offset", "value").collect()) == [
        (i, b"v%d" % i) for i in range(30)]
    # the same read without the CA is refused, naming the failure
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        reader(spark, f"127.0.0.1:{port}", "tls-read", tls="true").load().collect()
    with pytest.raises(ClientError, match="during the handshake"):
        Client("127.0.0.1", port, timeout=5)
