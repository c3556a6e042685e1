# Apache Iceberg's REST catalog server for the tests of a REST catalog (streams.table.catalog
# ``http://...``): org.apache.iceberg.rest.RESTCatalogServer, the server of Iceberg's
# iceberg-rest-fixture image, from Maven Central (pinned in rest_catalog/pom.xml; its runtime
# classpath resolved once by compat._java.maven_classpath, target/ git-ignored). `running`
# starts one `java` process: its backend an Iceberg JdbcCatalog on a SQLite file and a
# warehouse folder of its own, on a free port, reached on 127.0.0.1 (Jetty listens on every
# interface: the fixture has no host setting); stopped on exit.
# Rules: only a missing java/mvn or an unreachable Maven Central skips (the fixture in
# tests/conftest.py); a server that exits or does not answer GET /v1/config within the
# deadline fails the test with its log.
from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.error
import urllib.request

from compat._java import maven_classpath
from compat._servers import free_port

MODULE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rest_catalog")
MAIN = "org.apache.iceberg.rest.RESTCatalogServer"


def classpath() -> str:
    """The server's runtime classpath (Maven, once). Raises compat._java.JavaUnavailable
    when java/mvn is missing or Maven Central is unreachable, RuntimeError otherwise."""
    return maven_classpath(MODULE)


def _answers(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/v1/config", timeout=5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def running(cp: str, folder: str, wait_s: float = 120):
    """Yield the URI (``http://127.0.0.1:PORT``) of a new REST catalog server whose backend
    catalog and warehouse live in ``folder`` (``catalog.db``, ``warehouse/``); its log is
    ``folder/server.log``. Raises AssertionError (with the log) when it exits or does not
    answer within ``wait_s`` seconds."""
    os.makedirs(os.path.join(folder, "warehouse"), exist_ok=True)
    port = free_port()
    # RESTCatalogServer reads its catalog properties from CATALOG_* variables (CATALOG_URI:
    # uri, CATALOG_REST_PORT: rest.port): none of the caller's may reach it
    env = {k: v for k, v in os.environ.items() if not k.startswith("CATALOG_")}
    env.update(CATALOG_URI=f"jdbc:sqlite:{folder}/catalog.db",
               CATALOG_WAREHOUSE=f"file://{folder}/warehouse", CATALOG_REST_PORT=str(port))
    log_path = os.path.join(folder, "server.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xmx256m",
             "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", cp, MAIN],
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s
        while not _answers(uri):
            exited = proc.poll() is not None
            if exited or time.monotonic() > deadline:
                why = f"exited with {proc.returncode}" if exited else \
                    f"did not answer within {wait_s}s"
                with open(log_path, errors="replace") as f:
                    raise AssertionError(f"Iceberg's REST catalog server {why}; its log:\n"
                                         f"{f.read()[-6000:]}")
            time.sleep(0.2)
        yield uri
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
