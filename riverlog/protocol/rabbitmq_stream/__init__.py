# Sans-IO codec for the RabbitMQ Stream protocol (TCP 5552): frames.py names the frames,
# codec.py turns bytes into frames and frames into bytes, constants.py holds the numbers.
# Nothing here does I/O or keeps broker state; front doors and clients build on it.
from .codec import CURRENT, Dialect, FrameDecoder, decode, deliver_prefix, encode, simple_entry
from .constants import Command, Compression, OffsetType, ResponseCode
from .errors import FrameError

__all__ = [
    "CURRENT",
    "Command",
    "Compression",
    "Dialect",
    "FrameDecoder",
    "FrameError",
    "OffsetType",
    "ResponseCode",
    "decode",
    "deliver_prefix",
    "encode",
    "simple_entry",
]
