# The RabbitMQ Stream front door: TCP connections speaking the current protocol (and the 2020
# draft), over the broker core. The package owns sockets, per-connection state and flow
# control, and decodes and encodes with the sans-IO codec in riverlog.protocol.rabbitmq_stream;
# it never touches files. Layout (each module says what it owns and its rules):
#   server.py       listeners, the set of connections, broker notifications
#   connection.py   the connection core: socket, frame decoder, dispatch table, output
#   state.py        the connection state machine (handshake states as a table)
#   flow.py         flow control: reading held and resumed, writing paused
#   link.py         the small interface handlers reach their connection through; names
#   session.py      peer properties, SASL, tune, open, close, heartbeat
#   silent_close.py the delay before a refused login is answered: its door-wide bound
#   streams.py      create, delete, metadata, stats, partitions, route, super streams
#   arguments.py    Create arguments as a StreamConfig
#   publishing.py   publishers, publishes staged into chunks, confirms
#   consuming.py    subscriptions and delivery, credit, offsets
#   single_active.py  single active consumer (groups in broker/sac.py)
#   draft.py        the 2020 draft dialect
#   vhost_frames.py the names frames carry, in the connection's virtual host
# Wire facts: ../shared/reference/rabbitmq-stream-protocol.md.
from .arguments import stream_config_from_arguments
from .connection import RabbitStreamConnection
from .consuming import Subscription, resolve_offset
from .publishing import CHUNK_MAX_BYTES, CHUNK_MAX_ENTRIES, Publisher
from .server import RabbitStreamServer
from .session import PUBLISH_FRAME_MAX

__all__ = ["CHUNK_MAX_BYTES", "CHUNK_MAX_ENTRIES", "PUBLISH_FRAME_MAX", "Publisher",
           "RabbitStreamConnection", "RabbitStreamServer", "Subscription", "resolve_offset",
           "stream_config_from_arguments"]
