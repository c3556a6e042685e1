# The options of the riverlog Spark source and sink: parsing and checking the strings Spark
# hands over (a case-insensitive dict of str -> str) into typed, picklable settings.
# Rules: every error is a ValueError naming the option and what it accepts; defaults follow
# Spark's Kafka source; nothing here talks to a server (riverlog.spark.offsets does that)
# or imports pyspark.
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from ..client import DEFAULT_PORT, Client, parse_servers
from ..security.tls import ClientTLS

EARLIEST = -2
"""Offset sentinel in JSON offset specs: the oldest record kept (Kafka's -2)."""
LATEST = -1
"""Offset sentinel in JSON offset specs: after the newest committed record (Kafka's -1)."""


@dataclass(frozen=True)
class Connection:
    """Where and how to connect: ``servers`` [(host, port)], SASL PLAIN ``user``/``password``,
    request ``timeout`` in seconds, ``tls`` (None: plain TCP), SASL ``mechanism`` (PLAIN,
    or EXTERNAL: the client certificate of ``tls`` names the user). Picklable: it travels
    to executors inside partitions."""

    servers: tuple[tuple[str, int], ...] = (("127.0.0.1", DEFAULT_PORT),)
    user: str = "guest"
    password: str = "guest"
    timeout: float = 30.0
    tls: ClientTLS | None = None
    mechanism: str = "PLAIN"

    def connect(self, name: str = "riverlog-spark") -> Client:
        """A connected blocking client (the first server that answers). Raises ClientError
        naming every server tried."""
        return self._first(self.servers, name)

    def _first(self, addresses, name: str) -> Client:
        from ..client import ClientError
        errors = []
        for host, port in addresses:
            try:
                return Client(host, port, self.user, self.password, connection_name=name,
                              timeout=self.timeout, tls=self.tls, mechanism=self.mechanism)
            except ClientError as exc:
                errors.append(str(exc))
        raise ClientError("; ".join(errors))

    def connect_for(self, stream: str, *, write: bool, name: str = "riverlog-spark") -> Client:
        """A connected client on a server that holds ``stream`` (the RabbitMQ Stream name):
        its leader for ``write``, else its leader or any replica (replicas serve committed
        records only, so readers get the same offsets from any of them). In a cluster the
        first server that answers says where the stream lives (Metadata) and the client
        moves there when it is not that server; a single server is always the one. Raises
        ClientError (no server answers, the stream has no leader to write to)."""
        from ..client import ClientError
        client = self.connect(name)
        try:
            leader, replicas = client.placement(stream)
        except ClientError:  # a missing stream: the caller's own request says so
            return client
        here = client.server_address
        wanted = [leader] if write else [a for a in (leader, *replicas) if a is not None]
        if here is None or here in wanted:
            return client
        client.close()
        if not wanted:
            raise ClientError(f"stream {stream!r} has no leader to write to (a failover is "
                              f"under way, or no in-sync replica is left)")
        return self._first(wanted, name)


@dataclass(frozen=True)
class ReadOptions:
    """Parsed read options (see docs/spark.md "Options"). ``starting``/``ending`` are
    ``"earliest"``, ``"latest"`` or ``{stream: {partition: offset}}`` (offset -2/-1 for
    earliest/latest)."""

    connection: Connection
    streams: tuple[str, ...]
    starting: object = None  # None: the context's default (batch earliest, stream latest)
    ending: object = "latest"
    starting_timestamp: int | None = None
    min_partitions: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    max_records_per_batch: int = 65_536
    table_dir: str | None = None
    catalog: str | None = None  # the Iceberg catalog of the streams' tables (option catalog)


@dataclass(frozen=True)
class WriteOptions:
    """Parsed write options: the target ``stream``, the publisher reference ``prefix``
    (default: derived from the query or job), ``row_order`` ("input" or "sorted"),
    ``create`` (create the stream when missing)."""

    connection: Connection
    stream: str
    prefix: str | None = None
    row_order: str = "input"
    create: bool = False
    arguments: dict = field(default_factory=dict)


def _get(options: Mapping[str, str], name: str) -> str | None:
    # pyspark hands a CaseInsensitiveDict; plain dicts (tests, jobs) may use any case
    if name in options:
        return options[name]
    lower = name.lower()
    for key, value in options.items():
        if key.lower() == lower:
            return value
    return None


def _int(options: Mapping[str, str], name: str, minimum: int | None = None) -> int | None:
    raw = _get(options, name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"option {name}: expected an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"option {name}: must be >= {minimum}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name}: expected true or false, got {raw!r}")


def tls(options: Mapping[str, str]) -> ClientTLS | None:
    """``tls`` (true: TLS with the system's trust store), ``tls.ca``, ``tls.cert``,
    ``tls.key`` (PEM paths, readable on the driver and every executor) and
    ``tls.serverName``; any ``tls.*`` option turns TLS on. None: plain TCP."""
    files = [_get(options, f"tls.{name}") or None for name in ("ca", "cert", "key",
                                                               "serverName")]
    if not _bool(options, "tls", False) and not any(files):
        return None
    try:
        return ClientTLS(*files)
    except ValueError as exc:
        raise ValueError(f"options tls.cert and tls.key: {exc}") from None


def connection(options: Mapping[str, str]) -> Connection:
    """``servers`` ("host:port,..."; default 127.0.0.1:5552, with TLS the door's TLS port),
    ``user``, ``password`` (default guest/guest), ``timeout`` (seconds, default 30), the
    ``tls`` options and ``saslMechanism`` (PLAIN or EXTERNAL, default PLAIN)."""
    servers = _get(options, "servers") or "127.0.0.1:5552"
    try:
        parsed = tuple(parse_servers(servers))
    except ValueError as exc:
        raise ValueError(f"option servers: {exc}") from None
    timeout = _get(options, "timeout")
    try:
        t = float(timeout) if timeout else 30.0
    except ValueError:
        raise ValueError(f"option timeout: expected seconds, got {timeout!r}") from None
    mechanism = (_get(options, "saslMechanism") or "PLAIN").strip().upper()
    if mechanism not in ("PLAIN", "EXTERNAL"):
        raise ValueError(f"option saslMechanism: expected PLAIN or EXTERNAL, got {mechanism!r}")
    return Connection(parsed, _get(options, "user") or "guest",
                      _get(options, "password") or "guest", t, tls(options), mechanism)


def streams(options: Mapping[str, str]) -> tuple[str, ...]:
    """``stream``: one stream name or a comma-separated list (order kept, duplicates
    dropped). Raises ValueError when missing."""
    raw = _get(options, "stream") or _get(options, "streams")
    names = tuple(dict.fromkeys(s.strip() for s in (raw or "").split(",") if s.strip()))
    if not names:
        raise ValueError("option stream is required: the name of a riverlog stream "
                         "(or a comma-separated list)")
    return names


def offset_spec(raw: str | None, name: str, names: tuple[str, ...], *,
                allow_earliest: bool = True) -> object:
    """Parse ``earliest`` / ``latest`` / JSON ``{"stream": {"0": 42}}``. Partition keys are
    strings of integers; offsets are >= 0 or -2 (earliest) / -1 (latest)."""
    if raw is None:
        return None
    text = raw.strip()
    if text.lower() == "latest":
        return "latest"
    if text.lower() == "earliest":
        if not allow_earliest:
            raise ValueError(f"option {name}: earliest is not allowed here")
        return "earliest"
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"option {name}: expected earliest, latest or JSON like "
                         f'{{"stream": {{"0": 42}}}}, got {raw!r}') from None
    if not isinstance(spec, dict):
        raise ValueError(f"option {name}: the JSON must be an object of streams")
    out: dict[str, dict[str, int]] = {}
    for stream, parts in spec.items():
        if stream not in names:
            raise ValueError(f"option {name}: stream {stream!r} is not in option stream "
                             f"({', '.join(names)})")
        if not isinstance(parts, dict):
            raise ValueError(f"option {name}: {stream!r} must map partitions to offsets")
        out[stream] = {}
        for part, offset in parts.items():
            if not str(part).isdigit() or not isinstance(offset, int) or offset < EARLIEST \
                    or (offset == EARLIEST and not allow_earliest):
                raise ValueError(f"option {name}: bad entry {stream!r}: {{{part!r}: {offset!r}}}")
            out[stream][str(int(part))] = offset
    return out


def read_options(options: Mapping[str, str]) -> ReadOptions:
    """Parse and check read options; raises ValueError naming the bad one."""
    names = streams(options)
    batch_rows = _int(options, "maxRecordsPerBatch", 1) or 65_536
    return ReadOptions(
        connection=connection(options),
        streams=names,
        starting=offset_spec(_get(options, "startingOffsets"), "startingOffsets", names),
        ending=offset_spec(_get(options, "endingOffsets"), "endingOffsets", names,
                           allow_earliest=False) or "latest",
        starting_timestamp=_int(options, "startingTimestamp", 0),
        min_partitions=_int(options, "minPartitions", 1),
        max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger", 1),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        max_records_per_batch=batch_rows,
        table_dir=_get(options, "tableDir") or None,
        catalog=_get(options, "catalog") or None,
    )


def write_options(options: Mapping[str, str]) -> WriteOptions:
    """Parse and check write options; raises ValueError naming the bad one."""
    names = streams(options)
    if len(names) != 1:
        raise ValueError("option stream: the sink writes to exactly one stream")
    order = (_get(options, "rowOrder") or "input").strip().lower()
    if order not in ("input", "sorted"):
        raise ValueError(f"option rowOrder: expected input or sorted, got {order!r}")
    prefix = _get(options, "publisherPrefix")
    if prefix is not None and not 0 < len(prefix.encode()) <= 180:
        raise ValueError("option publisherPrefix: 1 to 180 bytes")
    arguments = {}
    for key in ("max-length-bytes", "max-age", "stream-max-segment-size-bytes"):
        value = _get(options, key)
        if value is not None:
            arguments[key] = value
    return WriteOptions(connection(options), names[0], prefix, order,
                        _bool(options, "createStream", False), arguments)
