# The management HTTP API and web view: the subset of RabbitMQ's management API (port 15672)
# that stream users, tools and client test suites use, with RabbitMQ 3.13/4.x JSON shapes and
# status codes, and a read-only page at `/` (docs/operations.md, "Management API").
# Layout (each module says what it owns and its rules):
#   server.py       the aiohttp app: listening, basic auth, routes, errors, the web view
#   access.py       who sees what: the caller's user and the authorization rules
#   connections.py  connections, publishers and consumers of the RabbitMQ Stream door
#   queues.py       streams as queues, super streams as exchanges and bindings
#   paging.py       sorting, `name` filters and pages of the listings
#   users.py        runtime users and permissions (administrators only)
#   vhosts.py       virtual hosts: /api/vhosts, and a deleted vhost's streams
#   answers.py      RabbitMQ's error bodies, 503s and the listings' answer, shared by the routes
#   stream_groups.py  single active consumer groups (riverlog's /api/riverlog/stream/...)
#   super_streams.py  super streams made and deleted whole (rabbitmq-streams' commands)
#   web/            the page itself (static HTML + JS, no build step)
# Rules: every answer is computed on the event loop from the running server's state; nothing
# here runs on a publish or delivery path; each answer shows only what its caller may see.
from .server import ManagementServer

__all__ = ["ManagementServer"]
