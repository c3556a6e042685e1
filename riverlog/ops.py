# The operations commands behind `riverlog stream|publish|tail|stats`: what each one asks a
# running server and how the answer becomes rows or lines. The command line (cli.py) parses
# flags and prints; this module talks to the server.
# Rules: everything the RabbitMQ Stream protocol can express goes through riverlog.client
# (the blocking Client); listing streams, which that protocol cannot do, asks the Liftbridge
# gRPC API (FetchMetadata) with the same user, password and TLS settings; `stats`, and
# describe's table and replication rows, scrape the server's Prometheus endpoint and never
# read the data folder (a running server owns it). Every failure raises OpsError with one line
# that names the server and the cause, never a traceback.
from __future__ import annotations

import base64
import dataclasses
import json
import logging
import time
import urllib.error
import urllib.request
from typing import Callable, Iterable, Iterator

from .client import Client, ClientError, OffsetType, parse_servers
from .errors import RiverlogError
from .log.chunk import log_unreadable
from .record import Record, decode_record, encode_record
from .security.tls import ClientTLS
from .vhost_names import DEFAULT

log = logging.getLogger("riverlog.ops")

PUBLISH_BATCH = 1000
STREAM = ("vhost", "stream")  # the labels that name a stream in the server's metrics
TAIL_POLL_S = 0.5


class OpsError(RiverlogError):
    """An operations command failed; the message is the one line to show."""


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a running server is: its RabbitMQ Stream address (``host:port``), user and
    password, its Liftbridge gRPC address, and its metrics URL. ``timeout`` in seconds.
    With ``tls``, the RabbitMQ Stream address is the door's TLS port and the gRPC door
    serves TLS (docs/security.md). ``mechanism``: SASL PLAIN (user and password) or
    EXTERNAL (the user named by the client certificate of ``tls``)."""

    server: str = "127.0.0.1:5552"
    user: str = "guest"
    password: str = "guest"
    grpc: str = "127.0.0.1:9292"
    metrics: str = "http://127.0.0.1:15692/metrics"
    timeout: float = 10.0
    tls: ClientTLS | None = None
    mechanism: str = "PLAIN"

    def connect(self) -> Client:
        """A connected Client; raises OpsError when the server cannot be reached."""
        host, port = parse_servers(self.server)[0]
        try:
            return Client(host, port, self.user, self.password, timeout=self.timeout,
                          connection_name="riverlog-cli", tls=self.tls,
                          mechanism=self.mechanism)
        except ClientError as exc:
            hint = " (is `riverlog serve` running there? see --server)" if str(exc).startswith(
                "cannot connect") else ""
            raise OpsError(f"{exc}{hint}") from None


def _call(what: str, fn: Callable, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ClientError as exc:
        raise OpsError(f"{what}: {exc}") from None


# -- streams ----------------------------------------------------------------------------------


def stream_list(target: Target, internal: bool = False) -> list[tuple[str, int, str]]:
    """``[(name, partitions, subject)]`` of every stream, sorted by name, from the Liftbridge
    gRPC API's FetchMetadata (reference/liftbridge.md). Internal streams (``__cursors``,
    ``__activity``) only with ``internal``. With SASL PLAIN the call carries the user and
    password as `authorization: Basic` metadata (a door without authentication ignores it);
    with EXTERNAL the client certificate names the user. Raises OpsError."""
    import grpc

    from .protocol.liftbridge import api_pb2 as pb
    from .protocol.liftbridge.api_pb2_grpc import APIStub
    if target.tls is None:
        channel = grpc.insecure_channel(target.grpc)
    else:
        try:
            target.tls.context()  # grpc only logs bad files: check them here, by name
            credentials = target.tls.grpc_credentials()
        except OSError as exc:
            raise OpsError(f"TLS settings for {target.grpc}: {exc}") from None
        channel = grpc.secure_channel(target.grpc, credentials, target.tls.grpc_options())
    basic = base64.b64encode(f"{target.user}:{target.password}".encode()).decode()
    metadata = (("authorization", "Basic " + basic),) if target.mechanism == "PLAIN" else ()
    with channel:
        try:
            resp = APIStub(channel).FetchMetadata(pb.FetchMetadataRequest(),
                                                  timeout=target.timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise OpsError(f"cannot list streams through the Liftbridge gRPC API at "
                           f"{target.grpc}: {exc.code().name} {exc.details()} (see --grpc)"
                           ) from None
    rows = [(s.name, len(s.partitions), s.subject) for s in resp.streamMetadata
            if internal or not s.name.startswith("__")]
    return sorted(rows)


def stream_create(target: Target, name: str, arguments: dict[str, str],
                  exist_ok: bool = False) -> bool:
    """Create ``name`` with RabbitMQ Create ``arguments`` (``max-length-bytes``, ``max-age``,
    ``stream-max-segment-size-bytes``). False when it existed and ``exist_ok``."""
    with target.connect() as client:
        return _call(f"create {name!r}", client.create_stream, name, arguments,
                     exist_ok=exist_ok)


def stream_delete(target: Target, name: str, missing_ok: bool = False) -> bool:
    """Delete ``name``; False when it did not exist and ``missing_ok``."""
    with target.connect() as client:
        return _call(f"delete {name!r}", client.delete_stream, name, missing_ok=missing_ok)


def stream_describe(target: Target, name: str,
                    consumers: Iterable[str] = ()) -> list[tuple[str, str]]:
    """``[(field, value)]`` about stream ``name``: its leader, first and end offsets, chunk
    ids (RabbitMQ StreamStats), the offset stored by each of ``consumers`` with its lag, on a
    cluster member its replication (``cluster_rows``), and its Parquet table
    (``table_rows``); the last two from the server's metrics. Raises OpsError (the stream
    does not exist, the server cannot be reached)."""
    with target.connect() as client:
        _, host, port = _call("metadata", client.metadata, name)[name]
        if host is None:
            raise OpsError(f"stream {name!r} does not exist on {target.server}")
        stats = _call(f"stats of {name!r}", client.stream_stats, name)
        first, end = _call(f"offsets of {name!r}", client.offset_range, name)
        rows = [("stream", name), ("leader", f"{host}:{port}"),
                ("first offset", str(first)), ("end offset", str(end)),
                ("messages", str(end - first))]
        rows += [(key.replace("_", " "), str(value)) for key, value in sorted(stats.items())]
        for consumer in consumers:
            stored = _call(f"offset of {consumer!r}", client.query_offset, consumer, name)
            rows.append((f"consumer {consumer}", "no stored offset" if stored is None else
                         f"offset {stored}, lag {max(end - 1 - stored, 0)}"))
    try:
        samples = scrape(target.metrics, target.timeout)
    except OpsError as exc:
        return rows + [("table", f"unknown ({exc})")]
    return rows + cluster_rows(samples, name) + table_rows(samples, name)


def cluster_rows(samples, name: str) -> list[tuple[str, str]]:
    """``[(field, value)]`` about the replication of stream ``name``'s partitions held by a
    cluster member, from its scraped metrics (riverlog_partition_*, riverlog_follower_*):
    leader server, replicas, ISR (under-replicated, under min ISR), leader epoch, high
    watermark, and where that server leads, each follower's lag. None on a single server."""
    def of(metric: str, *keys: str) -> dict[tuple[str, ...], float]:
        return {k[2:]: v for k, v in _by(samples, metric, "vhost", "stream", "partition",
                                         *keys).items() if k[:2] == (DEFAULT, name)}
    parts = sorted(of("riverlog_partition_replicas"), key=lambda k: int(k[0]))
    leaders = of("riverlog_partition_leader_info", "leader")
    in_sync = of("riverlog_partition_replica_in_sync", "replica")
    flags = {f: of(f"riverlog_partition_{f}") for f in ("under_replicated", "under_min_isr",
                                                        "leader_epoch", "high_watermark")}
    lag_m = of("riverlog_follower_lag_messages", "replica")
    lag_b = of("riverlog_follower_lag_bytes", "replica")
    seen = of("riverlog_follower_last_seen_seconds", "replica")
    rows = []
    for (p,) in parts:
        suffix = "" if len(parts) == 1 else f" partition {p}"
        leader = next((ld for (q, ld) in leaders if q == p), "") or "none"
        replicas = sorted(r for (q, r) in in_sync if q == p)
        isr = [r for r in replicas if in_sync[(p, r)]]
        state = [text for flag, text in (("under_replicated", "under-replicated"),
                                         ("under_min_isr", "under min ISR")) if flags[flag][(p,)]]
        rows += [(f"leader server{suffix}", leader),
                 (f"replicas{suffix}", ", ".join(replicas)),
                 (f"isr{suffix}", ", ".join(isr) + (f" ({', '.join(state)})" if state else "")),
                 (f"leader epoch{suffix}", _int(flags["leader_epoch"][(p,)])),
                 (f"high watermark{suffix}", str(int(flags["high_watermark"][(p,)])))]
        followers = sorted(r for (q, r) in seen if q == p)
        if not followers:
            rows.append((f"follower lag{suffix}", f"shown by the leader's metrics ({leader})"))
        for r in followers:
            sync = "in sync" if in_sync.get((p, r)) else "out of sync"
            lag = ("no fetch yet" if (p, r) not in lag_m else
                   f"lag {_int(lag_m[(p, r)])} messages ({_size(lag_b[(p, r)])})")
            rows.append((f"follower {r}{suffix}",
                         f"{sync}, {lag}, last fetch {seen[(p, r)]:.1f}s ago"))
    return rows


def table_rows(samples, name: str) -> list[tuple[str, str]]:
    """``[("table", what)]`` about stream ``name``'s Parquet table, from the server's
    scraped metrics (riverlog_table_*): "off", or the offsets it holds, its files and bytes,
    and its lag; one row per partition."""
    metrics = {metric: {p: v for (h, s, p), v in _by(samples, f"riverlog_table_{metric}",
                                                     "vhost", "stream", "partition").items()
                        if (h, s) == (DEFAULT, name)}
               for metric in ("first_offset", "end_offset", "bytes", "files", "lag_messages",
                              "lag_seconds", "failing")}
    ends = metrics["end_offset"]
    if not ends:
        return [("table", "off")]
    rows = []
    for p in sorted(ends, key=int):
        first, end = int(metrics["first_offset"][p]), int(ends[p])
        held = "no offsets yet" if end < 0 else f"offsets {first}..{end - 1}"
        files = int(metrics["files"][p])
        text = (f"on, {held}, {files} file{'' if files == 1 else 's'}, "
                f"{int(metrics['bytes'][p])} bytes, lag "
                f"{int(metrics['lag_messages'][p])} messages "
                f"({metrics['lag_seconds'][p]:.1f}s)")
        if metrics["failing"][p]:
            text += ", the last pass failed (see the server log)"
        rows.append(("table" if len(ends) == 1 else f"table partition {p}", text))
    for labels, _ in samples.get("riverlog_table_info", ()):
        if labels.get("stream") == name and labels.get("vhost", DEFAULT) == DEFAULT:
            # read_table(..., catalog=...) finds it there
            rows.append(("table catalog", f"{labels.get('format')} table "
                                          f"{labels.get('table')} in {labels.get('catalog')}"))
    return rows


# -- publish and tail -------------------------------------------------------------------------


def publish(target: Target, stream: str, messages: Iterable[bytes], *, key: bytes | None = None,
            publisher_name: str | None = None) -> int:
    """Publish ``messages`` (values; each stored as one record with ``key``) and wait for
    every confirm. With ``publisher_name`` the server deduplicates and publishing ids go on
    from the highest it stored for that name. Returns how many were confirmed."""
    with target.connect() as client:
        what = f"publish to {stream!r}"
        pub = _call(what, client.publisher, stream, publisher_name)
        next_id = 1
        if publisher_name:
            next_id += _call(what, client.query_publisher_sequence, publisher_name, stream)
        sent = 0
        batch: list[bytes] = []
        for value in messages:
            batch.append(encode_record(Record(value=value, key=key,
                                              timestamp_ns=time.time_ns())))
            if len(batch) >= PUBLISH_BATCH:
                _call(what, pub.publish, batch, range(next_id + sent, next_id + sent + len(batch)))
                sent += len(batch)
                batch = []
        if batch:
            _call(what, pub.publish, batch, range(next_id + sent, next_id + sent + len(batch)))
            sent += len(batch)
        _call(what, pub.flush)
        return sent


START_POSITIONS = ("earliest", "latest", "new")


def tail(target: Target, stream: str, start: str = "earliest", *, follow: bool = False,
         limit: int = 0) -> Iterator[tuple[int, Record]]:
    """``(offset, record)`` of the messages of ``stream`` from ``start``: ``earliest`` (the
    oldest kept), ``latest`` (the newest), ``new`` (only what arrives from now on) or an
    offset (a number). Without ``follow`` it ends at the end of the stream as it was when
    it started; with it, it waits for more until interrupted. ``limit`` > 0 ends it after
    that many messages. Raises OpsError."""
    with target.connect() as client:
        first, end = _call(f"offsets of {stream!r}", client.offset_range, stream)
        if start == "earliest":
            offset = first
        elif start == "latest":
            offset = max(end - 1, first)
        elif start == "new":
            offset = end
        else:
            try:
                offset = max(int(start), first)
            except ValueError:
                raise OpsError(f"--from: expected {', '.join(START_POSITIONS)} or an offset, "
                               f"got {start!r}") from None
        if not follow and offset >= end:
            return
        sub = _call(f"subscribe to {stream!r}", client.subscribe, stream, OffsetType.OFFSET,
                    offset, credit=8)
        count = 0
        unreadable = log_unreadable(log, stream)
        try:
            while True:
                chunks = _call(f"read {stream!r}", sub.next_chunks, 16, TAIL_POLL_S)
                for chunk in chunks:
                    default_ns = chunk.header.timestamp_ms * 1_000_000
                    for rec_offset, raw in chunk.records(unreadable):
                        if rec_offset < offset:
                            continue
                        if not follow and rec_offset >= end:
                            return
                        yield rec_offset, decode_record(raw, default_ns)
                        count += 1
                        if limit and count >= limit:
                            return
                    offset = chunk.next_offset
                if not follow and offset >= end:
                    return
        finally:
            sub.close()


def format_record(offset: int, record: Record, fmt: str) -> str:
    """One output line: ``text`` is the value (UTF-8, undecodable bytes replaced); ``json``
    an object with offset, timestamp_ns, key, value and headers (bytes as UTF-8 text)."""
    if fmt == "text":
        return record.value.decode("utf-8", "replace")
    return json.dumps({
        "offset": offset, "timestamp_ns": record.timestamp_ns,
        "key": None if record.key is None else record.key.decode("utf-8", "replace"),
        "value": record.value.decode("utf-8", "replace"),
        "headers": {k: v.decode("utf-8", "replace") for k, v in record.headers.items()}})


# -- stats ------------------------------------------------------------------------------------


def scrape(url: str, timeout: float = 10.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``{sample name: [(labels, value)]}`` from a Prometheus endpoint. Raises OpsError when
    it cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise OpsError(f"cannot read metrics at {url}: {reason} (is `riverlog serve` "
                       f"running with metrics on? see --metrics-url)") from None
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def _by(samples, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for labels, value in samples.get(name, ()):  # no vhost label (riverlog before it): "/"
        k = tuple(labels.get(key, DEFAULT if key == "vhost" else "") for key in keys)
        out[k] = out.get(k, 0.0) + value
    return out


def stats_tables(samples) -> list[tuple[str, list[str], list[list[str]]]]:
    """The tables ``riverlog stats`` prints, as ``(title, header, rows)``: streams
    (partitions, disk, messages kept, messages and bytes in and out over every door since
    the server started), doors (connections,
    subscriptions, confirms, mean confirm latency, errors), consumers (lag), errors, the
    NATS door's link to its NATS server (connected, reconnects; no row without NATS), the
    resource alarms (``alarm_rows``), and on a cluster member ``cluster_tables``."""
    disk = _by(samples, "riverlog_stream_disk_bytes", *STREAM)
    first = _by(samples, "riverlog_partition_first_offset", *STREAM, "partition")
    kept: dict[tuple[str, ...], float] = {}
    parts: dict[tuple[str, ...], int] = {}
    for (*stream, partition), end in _by(samples, "riverlog_partition_committed_offset",
                                         *STREAM, "partition").items():
        start = first.get((*stream, partition), 0)
        key = tuple(stream)
        kept[key] = kept.get(key, 0) + max(end + 1 - start, 0)
        parts[key] = parts.get(key, 0) + 1
    pub_m = _by(samples, "riverlog_published_messages_total", *STREAM)
    pub_b = _by(samples, "riverlog_published_bytes_total", *STREAM)
    del_m = _by(samples, "riverlog_delivered_messages_total", *STREAM)
    del_b = _by(samples, "riverlog_delivered_bytes_total", *STREAM)
    names = sorted(set(disk) | set(pub_m) | set(del_m))
    streams = [[*n, _int(parts.get(n, 0)), _size(disk.get(n, 0)), _int(kept.get(n, 0)),
                _int(pub_m.get(n, 0)), _size(pub_b.get(n, 0)), _int(del_m.get(n, 0)),
                _size(del_b.get(n, 0))] for n in names]
    conns = _by(samples, "riverlog_connections", "door")
    subs = _by(samples, "riverlog_subscriptions", "door")
    count = _by(samples, "riverlog_confirm_latency_seconds_count", "door")
    total = _by(samples, "riverlog_confirm_latency_seconds_sum", "door")
    errors = _by(samples, "riverlog_errors_total", "door")
    doors = sorted(set(conns) | set(subs) | set(count) | set(errors))
    door_rows = [[d[0], _int(conns.get(d, 0)), _int(subs.get(d, 0)), _int(count.get(d, 0)),
                  f"{1000 * total.get(d, 0) / count[d]:.3f}" if count.get(d) else "-",
                  _int(errors.get(d, 0))] for d in doors]
    lag = _by(samples, "riverlog_consumer_lag_messages", *STREAM, "partition", "consumer",
              "source")
    lag_rows = [[*k, _int(v)] for k, v in sorted(lag.items())]
    err = _by(samples, "riverlog_errors_total", "door", "code")
    err_rows = [[*k, _int(v)] for k, v in sorted(err.items())]
    connected = _by(samples, "riverlog_nats_connected")
    nats_rows = [["yes" if connected[()] else "no",
                  _int(_by(samples, "riverlog_nats_reconnects_total").get((), 0))]
                 ] if connected else []
    return [
        ("streams", ["vhost", "stream", "partitions", "disk", "messages", "published", "bytes in",
                     "delivered", "bytes out"], streams),
        ("doors", ["door", "connections", "subscriptions", "confirms", "confirm ms (mean)",
                   "errors"], door_rows),
        ("consumers", ["vhost", "stream", "partition", "consumer", "source", "lag"],
         lag_rows),
        ("errors", ["door", "code", "count"], err_rows),
        ("nats", ["connected", "reconnects"], nats_rows),
        ("alarms", ["resource", "alarm", "measure", "limit"], alarm_rows(samples)),
    ] + cluster_tables(samples)


def alarm_rows(samples) -> list[list[str]]:
    """The resource alarms (docs/operations.md "Resource alarms"): per resource whether its
    alarm holds, what was measured (disk: bytes available; memory: resident bytes) and the
    limit; and the NATS messages dropped during alarms. No rows before the first check."""
    rows = []
    for resource, alarm, measure, limit in (
            ("disk", "alarms_free_disk_space_watermark", "disk_space_available_bytes",
             "disk_space_available_limit_bytes"),
            ("memory", "alarms_memory_used_watermark", "process_resident_memory_bytes",
             "resident_memory_limit_bytes")):
        value = _by(samples, f"riverlog_{measure}")
        if value:
            rows.append([resource, "yes" if _by(samples, f"riverlog_{alarm}").get(()) else
                         "no", _size(value[()]), _size(_by(samples, f"riverlog_{limit}")[()])])
    dropped = _by(samples, "riverlog_dropped_messages_total", "door", "reason")
    rows += [[f"{door} dropped ({reason})", "-", _int(n), "-"]
             for (door, reason), n in sorted(dropped.items())]
    return rows


def cluster_tables(samples) -> list[tuple[str, list[str], list[list[str]]]]:
    """The tables ``riverlog stats`` adds on a cluster member (none on a single server):
    its Raft member (leader or not, term, commit index, leader elections and ISR shrinks and
    expands applied), each partition held here (leader, leader epoch, replicas, ISR, high
    watermark) and, where this server leads, each follower (in sync, lag)."""
    if "riverlog_raft_leader" not in samples:
        return []
    one = {name: _by(samples, f"riverlog_{name}").get((), 0)
           for name in ("raft_leader", "raft_term", "raft_commit_index",
                        "leader_elections_total", "isr_shrinks_total", "isr_expands_total")}
    raft = [["yes" if one["raft_leader"] else "no"] + [
        _int(one[n]) for n in ("raft_term", "raft_commit_index", "leader_elections_total",
                               "isr_shrinks_total", "isr_expands_total")]]
    keys = (*STREAM, "partition")
    leaders = _by(samples, "riverlog_partition_leader_info", *keys, "leader")
    members = _by(samples, "riverlog_partition_replica_in_sync", *keys, "replica")
    epoch = _by(samples, "riverlog_partition_leader_epoch", *keys)
    hwm = _by(samples, "riverlog_partition_high_watermark", *keys)
    under = _by(samples, "riverlog_partition_under_replicated", *keys)
    partitions = []
    for key in sorted(epoch, key=lambda k: (k[0], k[1], int(k[2]))):
        replicas = sorted(r for (*k, r) in members if tuple(k) == key)
        isr = [r for r in replicas if members[(*key, r)]]
        leader = next((ld for (*k, ld) in leaders if tuple(k) == key), "") or "none"
        partitions.append([*key, leader, _int(epoch[key]), ",".join(replicas), ",".join(isr),
                           str(int(hwm.get(key, -1))), "yes" if under.get(key) else "no"])
    lag_m = _by(samples, "riverlog_follower_lag_messages", *keys, "replica")
    lag_b = _by(samples, "riverlog_follower_lag_bytes", *keys, "replica")
    seen = _by(samples, "riverlog_follower_last_seen_seconds", *keys, "replica")
    followers = [[*k, "yes" if members.get(k) else "no",
                  _int(lag_m[k]) if k in lag_m else "-", _size(lag_b[k]) if k in lag_b else "-",
                  f"{v:.1f}"] for k, v in sorted(seen.items())]
    return [
        ("raft", ["leader", "term", "commit index", "elections", "isr shrinks", "isr expands"],
         raft),
        ("partitions", ["vhost", "stream", "partition", "leader", "epoch", "replicas", "isr",
                        "high watermark", "under-replicated"], partitions),
        ("followers", ["vhost", "stream", "partition", "replica", "in sync", "lag", "lag bytes",
                       "last fetch s"], followers),
    ]


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, numbers right-aligned."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if c[:1].isdigit() or c[:1] == "-" else c.ljust(w)
                         for c, w in zip(cells, widths)).rstrip()

    return "\n".join([line(header)] + [line(r) for r in rows])


def _int(value: float) -> str:
    return f"{int(value):,}"


def _size(value: float) -> str:
    if value < 1024:
        return f"{value:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"
