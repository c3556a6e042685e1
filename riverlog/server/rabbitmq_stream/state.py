# The connection state machine of the RabbitMQ Stream door, as tables (h11's _state.py idea):
# which frames each state handles and which event moves it to which state.
# States: NEW (the handshake: peer properties, SASL), AUTHENTICATED (SASL succeeded: Tune and
# Open may come), OPEN (every command), CLOSING (the door or the client began to close: only a
# Close is still answered; other frames are not handled).
# Rules: a transition missing from NEXT is a server bug and raises KeyError; a frame its state
# does not handle is refused with ACCESS_REFUSED (0x10) and the reason ``refusal`` gives, as
# rabbit_stream_reader refuses commands before authentication and Open; nothing here does I/O.
from __future__ import annotations

from ...protocol.rabbitmq_stream import frames as f

NEW, AUTHENTICATED, OPEN, CLOSING = "new", "authenticated", "open", "closing"
# events: a SASL exchange succeeded, Open was answered OK, the connection begins to close
LOGGED_IN, OPENED, CLOSE = "logged in", "opened", "close"

_HANDSHAKE = frozenset({f.PeerProperties, f.SaslHandshake, f.SaslAuthenticate, f.Close,
                        f.CloseResponse, f.Heartbeat})
_AUTHENTICATED = frozenset({f.Tune, f.TuneResponse, f.Open})

# state -> the frame types it handles (None: every frame the door knows)
ACCEPTS: dict[str, frozenset[type] | None] = {
    NEW: _HANDSHAKE,
    AUTHENTICATED: _HANDSHAKE | _AUTHENTICATED,
    OPEN: None,
    CLOSING: frozenset({f.Close}),
}

# (state, event) -> next state; a new SASL exchange after Open keeps the connection open
NEXT: dict[tuple[str, str], str] = {
    (NEW, LOGGED_IN): AUTHENTICATED,
    (AUTHENTICATED, LOGGED_IN): AUTHENTICATED,
    (AUTHENTICATED, OPENED): OPEN,
    (OPEN, LOGGED_IN): OPEN,
    (OPEN, OPENED): OPEN,
    (CLOSING, LOGGED_IN): CLOSING,  # a login that ends after the client's Close
    **{(state, CLOSE): CLOSING for state in (NEW, AUTHENTICATED, OPEN, CLOSING)},
}


class ConnectionState:
    """The state of one connection; ``accepts`` is ``ACCEPTS[state]`` (read on every frame)."""

    __slots__ = ("state", "accepts")

    def __init__(self) -> None:
        self.state = NEW
        self.accepts = ACCEPTS[NEW]

    def on(self, event: str) -> None:
        """Move on ``event`` (LOGGED_IN, OPENED, CLOSE). Raises ``KeyError`` for a transition
        the table does not have."""
        self.state = NEXT[(self.state, event)]
        self.accepts = ACCEPTS[self.state]

    @property
    def closing(self) -> bool:
        return self.state is CLOSING

    @property
    def open(self) -> bool:
        return self.state is OPEN

    def refusal(self, kind: type) -> str | None:
        """Why a frame of type ``kind`` is not handled now (None: it is)."""
        if self.accepts is None or kind in self.accepts:
            return None
        if self.state is NEW and kind in _AUTHENTICATED:
            return f"{'Open' if kind is f.Open else 'Tune'} before authentication"
        return f"{kind.__name__} before the connection was opened"
