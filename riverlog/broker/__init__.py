# The broker core: streams, partitions, publisher deduplication and stored offsets over the
# commit log. Front doors use only these names.
from .broker import Broker
from .partition import Partition
from .stream import Stream, StreamConfig

__all__ = ["Broker", "Partition", "Stream", "StreamConfig"]
