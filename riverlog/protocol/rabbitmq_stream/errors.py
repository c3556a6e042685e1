# The one error the RabbitMQ Stream codec raises on bad input from the peer. It carries the
# protocol response code the connection should be closed with; the codec never raises
# IndexError, struct.error or UnicodeDecodeError for bad peer bytes. (Bad frames handed to
# encode() are the caller's bug and raise TypeError/ValueError instead.)
from __future__ import annotations

from .constants import ResponseCode


class FrameError(Exception):
    """Bytes from the peer that cannot be framed or decoded.

    ``code`` is the response code to close the connection with (reference/rabbitmq-stream-
    protocol.md "Response codes"): ``ResponseCode.FRAME_TOO_LARGE`` (0x0e) for a size above
    the decoder's limit, ``ResponseCode.UNKNOWN_FRAME`` (0x0d) for an unknown key/version or a
    truncated, garbled or over-long body (what RabbitMQ sends for frames it cannot parse).
    ``frames`` holds the complete frames that preceded the bad one in the same
    ``FrameDecoder.feed`` call, so the caller can still act on them before closing.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.frames: tuple = ()

    def __str__(self) -> str:
        try:
            name = ResponseCode(self.code).name
        except ValueError:
            name = "?"
        return f"{self.message} (close with 0x{self.code:02x} {name})"


def malformed(message: str) -> FrameError:
    """A FrameError for a body that does not match its frame's layout (code 0x0d)."""
    return FrameError(ResponseCode.UNKNOWN_FRAME, message)
