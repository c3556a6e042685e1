# Shared fixtures. RabbitMQ Stream servers for the black-box tests in tests/compat:
#   stream_server          one `python -m riverlog serve` subprocess (free port, temporary data
#                          dir) shared by the session; restarted if a test killed it
#   stream_server_factory  make() -> a fresh server of the test's own (for restart() tests)
#   node_client            the Node.js RabbitMQ Stream client, installed with npm once per
#                          session (tests/compat/_node.py; used by tests/compat and
#                          tests/liftbridge)
#   go_client              the Go RabbitMQ Stream client's scenario program, built with
#                          `go build` once per session (tests/compat/_go.py; used by
#                          tests/compat, tests/cluster and tests/security)
#   java_client            RabbitMQ's Java stream client, built with Maven once per session
#                          (tests/compat/_java.py; used by tests/compat and tests/cluster)
#   go_liftbridge          go-liftbridge and nats.go (tests/compat/go_liftbridge), built once per
#                          session (tests/compat/_go_liftbridge.py; used by tests/liftbridge,
#                          tests/security and tests/cluster)
#   s3_tables              s3_tables(name) -> an s3:// table folder URI in a bucket of an S3
#                          endpoint moto serves in the test process (tests/spark, tests/cluster)
#   rest_catalog           the URI (http://127.0.0.1:PORT) of a new Apache Iceberg REST catalog
#                          server for the test (tests/spark/_rest_catalog.py; its jars resolved
#                          with Maven once per session; tests/spark, tests/cluster)
# With RIVERLOG_TEST_PEER=rabbitmq:PORT both point at an already-running RabbitMQ on
# 127.0.0.1:PORT instead, to check the tests themselves against the real thing. Markers:
#   riverlog_only  needs something RabbitMQ 3.10 lacks: skipped against the peer
#   restart        restarts the server: skipped against the peer unless
#                  RIVERLOG_TEST_PEER_RESTART names ../shared/tools/rabbitmq-loopback
# Every `riverlog serve` the tests start is one process (RIVERLOG_WORKERS=1, set here for the
# session, whatever the shell had) unless the test asks for workers (`--workers N`, or its own
# environment).
from __future__ import annotations

import os

import pytest

from compat._go import GoClient, GoUnavailable, build as build_go
from compat._go_liftbridge import GoLiftbridge, build as build_go_liftbridge
from compat._java import JavaClient, JavaUnavailable, build as build_java
from compat._node import NodeClient, NodeUnavailable, install
from compat._servers import PeerServer, RiverlogServer
from riverlog.cluster.local import WORKERS_ENV

os.environ[WORKERS_ENV] = "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "riverlog_only: needs a feature RabbitMQ 3.10 lacks")
    config.addinivalue_line("markers", "restart: restarts the server on the same data dir")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach what the test's riverlog servers logged to the report of a failed test."""
    report = (yield).get_result()
    if report.failed:
        for server, since in getattr(item, "_stream_servers", ()):
            if server.log(since):
                report.sections.append((f"riverlog log ({report.when})", server.log(since)[-20000:]))


def _peer_port() -> int | None:
    peer = os.environ.get("RIVERLOG_TEST_PEER", "")
    if not peer:
        return None
    kind, _, port = peer.partition(":")
    if kind != "rabbitmq" or not port.isdigit():
        raise pytest.UsageError(f"RIVERLOG_TEST_PEER={peer!r}: expected rabbitmq:PORT")
    return int(port)


def _skip_for_peer(request) -> None:
    if _peer_port() is None:
        return
    if request.node.get_closest_marker("riverlog_only"):
        pytest.skip("needs a riverlog-only feature (RabbitMQ 3.10 lacks it)")
    if request.node.get_closest_marker("restart") and not os.environ.get("RIVERLOG_TEST_PEER_RESTART"):
        pytest.skip("restarts the server: the RabbitMQ peer is not restarted "
                    "(set RIVERLOG_TEST_PEER_RESTART=../shared/tools/rabbitmq-loopback)")


def _new_server(tmp_dir) -> RiverlogServer | PeerServer:
    peer = _peer_port()
    if peer is not None:
        return PeerServer(peer)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    server = RiverlogServer(str(tmp_dir / "data"), str(tmp_dir / "server.log"))
    server.start()
    return server


def _stop(servers) -> None:
    problems = []
    for server in servers:
        server.stop()
        problems += server.problems
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def _session_server(tmp_path_factory):
    holder = [_new_server(tmp_path_factory.mktemp("riverlog"))]
    yield holder
    _stop(holder)


@pytest.fixture
def stream_server(request, _session_server, tmp_path_factory):
    _skip_for_peer(request)
    server = _session_server[0]
    if not server.alive():  # an earlier test killed it: that test failed; start afresh
        _session_server[0] = server = _new_server(tmp_path_factory.mktemp("riverlog"))
    request.node._stream_servers = [(server, server.log_size())]
    yield server
    if not server.alive():
        pytest.fail(f"the {server.kind} server died during the test", pytrace=False)


@pytest.fixture
def stream_server_factory(request, tmp_path):
    """``make()`` -> a started server of the test's own; all are stopped with SIGTERM at the
    end (a riverlog server must exit 0 promptly, or the teardown fails)."""
    _skip_for_peer(request)
    servers = []
    request.node._stream_servers = []

    def make():
        server = _new_server(tmp_path / f"server{len(servers)}")
        servers.append(server)
        request.node._stream_servers.append((server, 0))
        return server

    yield make
    _stop(servers)


@pytest.fixture(scope="session")
def node_client() -> NodeClient:
    """The Node.js RabbitMQ Stream client (tests/compat/_node.py), installed with npm once per
    session. Skips only when node/npm is missing or the npm registry is unreachable."""
    try:
        install()
    except NodeUnavailable as exc:
        pytest.skip(f"Node.js client tests: {exc}")
    return NodeClient()


@pytest.fixture(scope="session")
def go_client() -> GoClient:
    """The Go RabbitMQ Stream client's scenario program (tests/compat/_go.py), built once per
    session. Skips only when `go` is missing or the Go module proxy is unreachable."""
    try:
        return GoClient(build_go())
    except GoUnavailable as exc:
        pytest.skip(f"Go client tests: {exc}")


@pytest.fixture(scope="session")
def java_client() -> JavaClient:
    """RabbitMQ's Java stream client (tests/compat/_java.py), built with Maven once per
    session. Skips only when java/mvn is missing or Maven Central is unreachable."""
    try:
        return JavaClient(build_java())
    except JavaUnavailable as exc:
        pytest.skip(f"Java client tests: {exc}")


@pytest.fixture(scope="session")
def go_liftbridge() -> GoLiftbridge:
    """Liftbridge's Go client and nats.go (tests/compat/_go_liftbridge.py), built once per
    session. Skips only when go is missing or the Go module proxy is unreachable."""
    try:
        return GoLiftbridge(build_go_liftbridge())
    except GoUnavailable as exc:
        pytest.skip(f"go-liftbridge tests: {exc}")


@pytest.fixture(scope="session")
def s3_tables():
    """``s3_tables(name, key="test", secret="test")`` -> the URI of a table folder in a
    bucket of an S3 endpoint that moto serves in this process (a free port), with its
    credentials (``key:secret@``; moto takes any) and endpoint in the URI's options, as
    pyarrow.fs.FileSystem.from_uri takes them."""
    pytest.importorskip("moto")
    from moto.server import ThreadedMotoServer
    from pyarrow import fs

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"{host}:{port}"
    fs.S3FileSystem(access_key="test", secret_key="test", region="us-east-1", scheme="http",
                    endpoint_override=endpoint,
                    allow_bucket_creation=True).create_dir("riverlog-tables")

    def uri(name: str, key: str = "test", secret: str = "test") -> str:
        return (f"s3://{key}:{secret}@riverlog-tables/{name}?region=us-east-1&scheme=http"
                f"&endpoint_override={endpoint}")
    yield uri
    server.stop()


@pytest.fixture(scope="session")
def _rest_catalog_classpath() -> str:
    from spark._rest_catalog import classpath
    try:
        return classpath()
    except JavaUnavailable as exc:
        pytest.skip(f"Iceberg REST catalog tests: {exc}")


@pytest.fixture
def rest_catalog(_rest_catalog_classpath, tmp_path_factory):
    """The URI of a new Iceberg REST catalog server (Iceberg's RESTCatalogServer, its own
    backend catalog and warehouse), stopped after the test. Skips only when java/mvn is
    missing or Maven Central is unreachable."""
    from spark._rest_catalog import running
    with running(_rest_catalog_classpath, str(tmp_path_factory.mktemp("rest-catalog"))) as uri:
        yield uri
