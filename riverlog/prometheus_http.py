# The HTTP server of a Prometheus registry (GET /metrics): prometheus_client's WSGI app on its
# ThreadingWSGIServer in a daemon thread, as prometheus_client.start_http_server runs it, but
# polled every POLL_S for a stop, so that ``shutdown()`` returns in milliseconds instead of
# start_http_server's 0.5 s (a server's stop, and so a rolling restart, waited for it).
from __future__ import annotations

import socket
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

POLL_S = 0.05
"""How often the serving thread looks for a stop (socketserver's poll interval)."""


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # no line per scrape
        pass


def serve_registry(host: str, port: int, registry: CollectorRegistry) -> ThreadingWSGIServer:
    """Serve ``registry`` on ``host``:``port`` (0: a free one) from a daemon thread, as
    prometheus_client.start_http_server does (its address family choice too), polled every
    POLL_S for a stop. Raises ``OSError``."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                  flags=socket.AI_PASSIVE)[0]
    server = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
    httpd = make_server(address[0], port, make_wsgi_app(registry), server, _Quiet)
    threading.Thread(target=httpd.serve_forever, args=(POLL_S,), name="metrics",
                     daemon=True).start()
    return httpd
