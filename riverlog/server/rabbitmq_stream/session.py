# The session commands of the RabbitMQ Stream door: PeerProperties, SaslHandshake,
# SaslAuthenticate (PLAIN, EXTERNAL), Tune, Open, ExchangeCommandVersions, Heartbeat, Close and
# CloseResponse, and the heartbeats the server sends.
# Owns what a connection negotiated: frame_max, heartbeat period, Deliver v2.
# Rules: a refused login or Open is answered, then the socket closes a little later without a
# Close frame (as rabbit_stream_reader); a wrong password or user, a refused Open and a refused
# secret update are answered only after the silent close delay (RabbitMQ 4's; Link.refuse); a
# password check runs off the event loop with the connection's reading held (flow.LOGIN); the
# state machine (state.py) moves on LOGGED_IN, OPENED and CLOSE here; a peer silent for more
# than 2.25 heartbeat periods is dropped.
# Wire facts: ../shared/reference/rabbitmq-stream-protocol.md.
from __future__ import annotations

import asyncio
import time
from typing import Callable

from ... import __version__
from ...protocol.rabbitmq_stream import FrameDecoder, ResponseCode
from ...protocol.rabbitmq_stream import frames as f
from .flow import ALARM, LOGIN
from .link import Link
from .state import CLOSE, LOGGED_IN, OPENED, ConnectionState

OK = ResponseCode.OK
# After Open a Publish frame may exceed the negotiated frame_max, as RabbitMQ 3.9 to 4.2 allow
# (rstream's send_batch sends any batch as one frame), up to this bound on what one frame
# may make the server buffer (and decode: ~130 bytes of Python objects per message).
PUBLISH_FRAME_MAX = 16 * 1024 * 1024
LOGIN_REFUSED_LINGER_S = 0.2
# after a client's Close, how long a Close sent behind it is still answered (unless the client
# hangs up first, as clients do once answered)
CLOSE_LINGER_S = 1.0

TABLE_CATALOG_PROPERTY = "riverlog_table_catalog"
"""Open's answer: the Iceberg catalog of the server's stream tables (docs/spark.md), given
only to a client whose PeerProperties named this key: RabbitMQ answers Open with
advertised_host and advertised_port only, and the Go client (1.8.3, commandOpen) reads no
value for a key it does not know, so one more property breaks its connection."""

# ExchangeCommandVersions: [key, min, max] in key order (Publish and Deliver go to 2).
SERVER_COMMAND_VERSIONS = tuple(
    f.CommandVersion(key, 1, 2 if key in (0x02, 0x08) else 1)
    for key in range(0x01, 0x20) if key not in (0x03, 0x04, 0x08, 0x10, 0x1A))


def _negotiate(ours: int, theirs: int) -> int:
    """Tune: the smaller of two limits where 0 means "no limit"."""
    return min(ours, theirs) if ours and theirs else ours or theirs


class Session:
    """The session commands of one connection (``link``), moving its ``state``; ``decoder``
    is the connection's frame decoder, whose limits Open raises."""

    def __init__(self, link: Link, state: ConnectionState, decoder: FrameDecoder) -> None:
        self.link = link
        self.state = state
        self.decoder = decoder
        self.send = link.send
        self.config = link.config
        self.frame_max = self.config.frame_max
        self.heartbeat_s = self.config.heartbeat_s
        self.deliver_v2 = False
        self.mechanism: str | None = None  # the SASL mechanism of the first login
        # called after a secret update is answered OK (the connection rechecks its publishers
        # and subscriptions against the user's permissions now)
        self.secret_updated: Callable[[], None] = lambda: None
        self._heartbeat_task: asyncio.Task | None = None
        self._close_timer: asyncio.TimerHandle | None = None  # set by the client's Close

    def on_peer_properties(self, frame: f.PeerProperties) -> None:
        self.link.client_properties = dict(frame.properties or {})
        self.send(f.PeerPropertiesResponse(frame.correlation_id, OK, {
            "product": "riverlog", "version": "3.13.0", "riverlog_version": __version__,
            "cluster_name": "riverlog", "platform": "Python",
            "copyright": "riverlog contributors", "information": "https://riverlog.invalid/",
        }))

    def on_sasl_handshake(self, frame: f.SaslHandshake) -> None:
        mechanisms = ("PLAIN", "EXTERNAL") if self.link.peer_certificate() else ("PLAIN",)
        self.send(f.SaslHandshakeResponse(frame.correlation_id, OK, mechanisms))

    def _refuse(self, response: f.SaslAuthenticateResponse | f.OpenResponse, reason: str,
                silent_close: bool = True) -> None:
        """Answer SaslAuthenticate or Open with ``response`` (an error code) and close the
        socket a little later, without a Close frame: RabbitMQ's reader stops the connection
        there and sends nothing more (rabbit_stream_reader, handle_frame_pre_auth: steps
        ``failure``/``silent_close``), and a client that reads a Close there fails (the Node
        client cannot decode one). The linger lets a client that reads its last frames and
        the end of the stream together (rstream over TLS drops them) see the refusal. With
        ``silent_close`` the answer waits the silent close delay first (Link.refuse):
        rabbit_stream_reader.erl v4.1.4 waits for a refused password or user (0x08), Open
        (0x0c) and secret update (0x14, 0x15), not for an unknown mechanism (0x07), a
        malformed response (0x09) or a loopback-only user (0x0b).
        A refused secret update (the connection was open) lingers CLOSE_LINGER_S: riverlog
        announces 3.13.0, whose reader keeps the connection open then (closing it came with
        v4.1.4), so a client such as Java's (1.11) sends a Close and waits for its answer."""
        linger = CLOSE_LINGER_S if self.state.open else LOGIN_REFUSED_LINGER_S
        self.link.refuse(response, reason, linger, silent_close)

    def on_sasl_authenticate(self, frame: f.SaslAuthenticate) -> None:
        """PLAIN (NUL user NUL password, checked against the bcrypt hashes) or, on a TLS
        connection with a verified client certificate, EXTERNAL: the user is the certificate
        subject's CN and must be configured (its password is not checked); RabbitMQ's
        rabbitmq_auth_mechanism_ssl with ``ssl_cert_login_from = common_name``. A password
        not checked before runs bcrypt in a worker thread (Guard.login_async), this
        connection's reading paused meanwhile, so other connections are not held up."""
        link = self.link
        corr = frame.correlation_id
        if self.state.open and frame.mechanism != self.mechanism:  # a secret update
            self._refuse(f.SaslAuthenticateResponse(
                corr, ResponseCode.SASL_CANNOT_CHANGE_MECHANISM),
                f"user {link.user!r} may not change mechanism {self.mechanism} for "
                f"{str(frame.mechanism)[:20]!r}")  # a null mechanism is None
            return
        certificate = link.peer_certificate() if frame.mechanism == "EXTERNAL" else None
        if certificate:
            user = link.guard.certificate_user(certificate)
            if user is None:
                self._refuse(f.SaslAuthenticateResponse(corr, ResponseCode.AUTHENTICATION_FAILURE),
                             "no configured user for the client certificate")
            else:
                self._logged_in(corr, user, None, "EXTERNAL")
        elif frame.mechanism == "PLAIN":
            parts = (frame.data or b"").split(b"\0")
            if len(parts) != 3:
                self._refuse(f.SaslAuthenticateResponse(corr, ResponseCode.SASL_ERROR),
                             "malformed PLAIN response", silent_close=False)
                return
            user, password = parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
            link.flow.hold(LOGIN)
            checked = asyncio.ensure_future(link.guard.login_async(user, password,
                                                                   link.peer_host))
            checked.add_done_callback(
                lambda done: self._logged_in(corr, user, done.result(), "PLAIN"))
        else:  # closed too, as rabbit_stream_reader (connection_step failure)
            self._refuse(f.SaslAuthenticateResponse(
                corr, ResponseCode.SASL_MECHANISM_NOT_SUPPORTED),
                f"unknown SASL mechanism {str(frame.mechanism)[:20]!r}", silent_close=False)

    def _logged_in(self, corr: int, user: str, refused: str | None, mechanism: str) -> None:
        """Finish SaslAuthenticate: ``refused`` is None (then Tune follows), "password" or
        "loopback" (riverlog.security.guard.Guard.login). After Open it is a secret update:
        the same user's, answered OK with no Tune, then ``secret_updated()`` (publishers and
        subscriptions the user's permissions no longer allow end, as
        evaluate_state_after_secret_update ends them); another user's is refused with
        SASL_CANNOT_CHANGE_USERNAME and the connection closed (rabbit_stream_reader,
        handle_frame_post_auth, sasl_authenticate: "Not allowed to change username")."""
        link = self.link
        if link.flow.gone():
            return
        link.flow.release(LOGIN)
        if refused == "password":
            self._refuse(f.SaslAuthenticateResponse(corr, ResponseCode.AUTHENTICATION_FAILURE),
                         f"authentication failed for {user!r}")
        elif refused == "loopback":
            self._refuse(f.SaslAuthenticateResponse(
                corr, ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK),
                f"user {user!r} may only connect from loopback", silent_close=False)
        elif self.state.open:
            if user != link.user:
                self._refuse(f.SaslAuthenticateResponse(
                    corr, ResponseCode.SASL_CANNOT_CHANGE_USERNAME),
                    f"user {link.user!r} may not become {user!r} (only its secret may change)")
            else:
                self.send(f.SaslAuthenticateResponse(corr, OK))
                self.secret_updated()
        else:
            link.user, self.mechanism = user, mechanism
            self.state.on(LOGGED_IN)
            self.send(f.SaslAuthenticateResponse(corr, OK))
            self.send(f.Tune(self.config.frame_max, self.config.heartbeat_s))

    def on_tune(self, frame: f.Tune | f.TuneResponse) -> None:
        self.frame_max = _negotiate(self.config.frame_max, frame.frame_max)
        self.heartbeat_s = _negotiate(self.config.heartbeat_s, frame.heartbeat)

    def on_open(self, frame: f.Open) -> None:
        """Open a virtual host that exists (``""`` is ``/``) and the user may reach
        (Authorizer.vhost_access: a permission on it while authorization is on); any other
        is answered VIRTUAL_HOST_ACCESS_FAILURE (0x0c), as rabbit_stream_reader answers
        rabbit_access_control:check_vhost_access failing, and the connection closed."""
        vhost = frame.virtual_host or "/"
        guard = self.link.guard
        refused = (f"no virtual host {vhost!r}" if not guard.runtime.has_vhost(vhost) else
                   None if guard.authorizer.vhost_access(self.link.user, vhost) else
                   f"user {self.link.user!r} has no permission on virtual host {vhost!r}")
        if refused is not None:
            self._refuse(f.OpenResponse(frame.correlation_id,
                                        ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE), refused)
            return
        self.link.vhost = vhost
        self.state.on(OPENED)
        self.decoder.max_frame_size = self.frame_max
        self.decoder.max_publish_frame_size = PUBLISH_FRAME_MAX
        host, port = self.link.server.advertised_for(self.link.tls)
        properties = {"advertised_host": host, "advertised_port": str(port)}
        if self.link.server.table_catalog is not None and \
                TABLE_CATALOG_PROPERTY in self.link.client_properties:  # asked for it
            properties[TABLE_CATALOG_PROPERTY] = self.link.server.table_catalog
        self.send(f.OpenResponse(frame.correlation_id, OK, properties))
        if self.heartbeat_s:
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeats())

    def on_exchange_command_versions(self, frame: f.ExchangeCommandVersions) -> None:
        for version in frame.versions:
            if version.key == 0x08 and version.max_version >= 2:
                self.deliver_v2 = True
        self.send(f.ExchangeCommandVersionsResponse(frame.correlation_id, OK,
                                                    SERVER_COMMAND_VERSIONS))

    def on_heartbeat(self, frame: f.Heartbeat) -> None:
        pass  # receiving it already refreshed link.last_received

    def on_close(self, frame: f.Close) -> None:
        """CloseResponse; the socket closes when the client hangs up, at the latest
        CLOSE_LINGER_S after its first Close. Meanwhile other frames are ignored but a Close
        sent behind the first one is answered too: RabbitMQ 3.10 answers every Close of the
        read it closes in, and the Node client sends a second Close when a consumer closes
        during client.close() and waits for both answers (its two writes may arrive apart)."""
        self.send(f.CloseResponse(frame.correlation_id, OK))
        self.state.on(CLOSE)
        if self._close_timer is None:
            self._close_timer = asyncio.get_running_loop().call_later(
                CLOSE_LINGER_S, self.link.hang_up, 0.0)

    def on_close_response(self, frame: f.CloseResponse) -> None:
        self.link.hang_up(0.0)

    async def _heartbeats(self) -> None:
        """Every half period, a Heartbeat when nothing was sent for about that long, as
        RabbitMQ's rabbit_heartbeat sender does (clients such as the Go one count a period
        without any frame as a miss); a peer silent for 2.25 periods is gone."""
        link = self.link
        period = self.heartbeat_s
        while True:
            await asyncio.sleep(period / 2)
            now = time.monotonic()
            if link.flow.holds(ALARM):  # not read during a resource alarm: not its silence
                link.last_received = now
            # timers may fire a little early or late: judge with some slack
            if now - link.last_received > 2.25 * period:
                link.fail(ResponseCode.OK, "missed heartbeats: the peer is gone")
                link.abort()
                return
            if now - link.last_sent >= 0.375 * period:
                self.send(f.Heartbeat())

    def close(self) -> None:
        """The connection is gone: stop the heartbeats."""
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
