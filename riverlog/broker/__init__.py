# The broker core: streams, partitions, publisher deduplication, stored offsets, super streams
# and single-active-consumer groups over the
# commit log. Front doors use only these names.
from .broker import RESERVED_STREAMS, Broker, check_writable
from .partition import Partition
from .sac import Notification, SingleActiveConsumers
from .stream import Stream, StreamConfig, SuperStream
from .superstreams import SuperStreams

__all__ = ["RESERVED_STREAMS", "Broker", "Notification", "Partition", "SingleActiveConsumers",
           "Stream", "StreamConfig", "SuperStream", "SuperStreams", "check_writable"]
