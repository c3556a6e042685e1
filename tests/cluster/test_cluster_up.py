# `riverlog cluster up`: three real `riverlog serve` processes on free ports, used through
# gufo-liftbridge and riverlog's generated gRPC stub: the printed table says where each door
# listens, a stream made through one server is on all three, the metadata survives a SIGKILL
# of the Raft leader's process (the two left still create streams), and SIGTERM stops every
# server; bound to 0.0.0.0 the servers advertise 127.0.0.1; a killed partition leader started
# again leads nothing and acks no write before it caught up with Raft. Waits are generous
# polls, never timed assertions.
from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import urllib.request

import grpc
import pytest

from _cluster import (WAIT_S, cluster_up, metadata, raft_leader, read_table, start_cluster_up,
                      stop_cluster_up, until, values, with_stream)
from riverlog.cluster.local import LocalCluster, Member, layout, serve_command
from riverlog.ops import scrape
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc

__all__ = ["cluster_up"]  # the fixture, used by name


async def test_cluster_up_serves_and_survives_the_raft_leaders_kill(cluster_up, tmp_path):
    from gufo.liftbridge.client import LiftbridgeClient
    from gufo.liftbridge.types import AckPolicy
    rows = read_table(cluster_up)
    assert sorted(rows) == ["s0", "s1", "s2"]
    assert oct(os.stat(tmp_path / "cluster" / "raft-password").st_mode & 0o777) == "0o600"
    grpc_of = {s: row["Liftbridge gRPC"] for s, row in rows.items()}
    async with LiftbridgeClient([grpc_of["s1"]]) as client:
        await client.create_stream("orders", subject="orders", replication_factor=3,
                                   wait_for_stream=True)
        # at once: CreateStream returned once the leader said it leads (Liftbridge's
        # partition status request), so it listens. gufo publishes through its seed (s1): a
        # follower, unless s1 leads, sends it to the leader through NATS (no deadline, so no
        # ack is waited for)
        await client.publish(b"first", stream="orders", ack_policy=AckPolicy.LEADER)
        # cursors are each server's own (outside the metadata): the server asked leads them
        # (gufo retries for ever a cursor stream without a leader: bounded here)
        await asyncio.wait_for(client.set_cursor(stream="orders", partition=0,
                                                 cursor_id="c", offset=0), WAIT_S)
        assert await asyncio.wait_for(client.get_cursor(
            stream="orders", partition=0, cursor_id="c"), WAIT_S) == 1
    leaders = set()
    for address in grpc_of.values():
        meta = await until("orders everywhere", lambda a=address: with_stream(a, "orders"))
        assert len(meta.brokers) == 3
        (part,) = [s for s in meta.streamMetadata if s.name == "orders"][0].partitions.values()
        leaders.add(part.leader)
    assert len(leaders) == 1 and leaders <= set(rows)
    leader_address = grpc_of[leaders.pop()]

    async def stored():
        meta = await metadata(leader_address)
        (part,) = [s for s in meta.streamMetadata if s.name == "orders"][0].partitions.values()
        return part.newestOffset == 0
    await until("gufo's publish stored on the leader", stored)

    leader = await until("a Raft leader", lambda: asyncio.to_thread(raft_leader, rows))
    os.kill(int(rows[leader]["pid"]), signal.SIGKILL)
    left = [s for s in rows if s != leader]

    async def created() -> bool:
        async with grpc.aio.insecure_channel(grpc_of[left[0]]) as channel:
            try:
                await api_pb2_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(
                    name="after", subject="after", replicationFactor=2), timeout=10)
            except grpc.aio.AioRpcError as exc:
                return exc.code() == grpc.StatusCode.ALREADY_EXISTS
            return True
    await until("a stream created without the old Raft leader", created)
    for server_id in left:
        meta = await until("after on the servers left",
                           lambda a=grpc_of[server_id]: with_stream(a, "after"))
        assert {s.name for s in meta.streamMetadata} >= {"orders", "after"}

    cluster_up.send_signal(signal.SIGTERM)
    assert cluster_up.wait(60) == 0
    for server_id in left:  # every server stopped with it
        assert await metadata(grpc_of[server_id]) is None


def test_members_reach_each_other_at_the_advertised_host(tmp_path):
    # bound to a wildcard, the servers are told of each other (Raft, NATS routes) and tell
    # clients loopback, or the host given; the doors still listen on the wildcard
    for host, advertise, expected in [("0.0.0.0", None, "127.0.0.1:7014"),
                                      ("::", None, "[::1]:7014"),
                                      ("0.0.0.0", "10.1.2.3", "10.1.2.3:7014"),
                                      ("127.0.0.1", None, "127.0.0.1:7014")]:
        members = [Member(f"s{i}", {name: 7000 + 10 * i + n for n, name in enumerate(
            ("stream", "grpc", "nats", "nats_cluster", "raft", "metrics"))}, host, advertise)
            for i in range(2)]
        command, env = serve_command(members[0], members, str(tmp_path))
        assert command[command.index("--host") + 1] == host
        told = expected.rsplit(":", 1)[0].strip("[]")
        assert ("--advertised-host" in command) == (told != host)
        if told != host:
            assert command[command.index("--advertised-host") + 1] == told
        assert command[command.index("--nats-routes") + 1] == expected.replace("7014", "7013")
        assert env["LIFTBRIDGE_RIVERLOG_RAFT_ADDRESS"] == expected.replace("7014", "7004")
        assert env["LIFTBRIDGE_RIVERLOG_RAFT_PEERS"] == "s1=" + expected


async def test_cluster_up_on_a_wildcard_address_advertises_loopback(tmp_path):
    # `cluster up --host 0.0.0.0`: the doors listen on every address, but the table, what
    # FetchMetadata tells clients and the Raft members name 127.0.0.1, where the servers are
    # reached (0.0.0.0 is no address to connect to)
    proc = start_cluster_up(tmp_path / "cluster", "--servers", "2", "--host", "0.0.0.0")
    try:
        rows = read_table(proc)
        addresses = [v for row in rows.values() for k, v in row.items()
                     if k not in ("server", "pid")]
        assert len(addresses) == 14 and all(a.startswith("127.0.0.1:") for a in addresses)
        for server_id, row in rows.items():
            meta = await until("FetchMetadata", lambda r=row: metadata(r["Liftbridge gRPC"]))
            assert sorted((b.id, f"{b.host}:{b.port}") for b in meta.brokers) == sorted(
                (s, r["Liftbridge gRPC"]) for s, r in rows.items())
            with open(tmp_path / "cluster" / server_id / "riverlog.log") as f:
                raft = [line for line in f if "Raft on" in line]
            (peer,) = [r["Raft"] for s, r in rows.items() if s != server_id]
            assert raft and raft[-1].rstrip().endswith(f"Raft on {row['Raft']}, peers {peer}")
    finally:
        stop_cluster_up(proc)


class _Restart:
    """A 3-server LocalCluster whose partition leader of "orders" (RF=3) was SIGKILLed and
    replaced: ``cluster``, ``grpc_of`` (server id -> gRPC address), ``old`` (the killed
    leader's id, ``index`` its place in ``cluster.procs``), ``others``."""

    def __init__(self, directory: str) -> None:
        self.cluster = LocalCluster(directory, 3)
        self.grpc_of = {m.id: f"{m.advertised}:{m.ports['grpc']}"
                        for m in self.cluster.members}

    async def leader_seen_by(self, server_id: str) -> str | None:
        meta = await with_stream(self.grpc_of[server_id], "orders")
        return meta and [s for s in meta.streamMetadata
                         if s.name == "orders"][0].partitions[0].leader

    async def other_leader_seen_by(self, server_id: str) -> str | None:
        """The leader ``server_id`` names, once it is not the killed one (nor none)."""
        leader = await self.leader_seen_by(server_id)
        return leader if leader not in ("", self.old) else None

    async def commit_index_saved(self) -> None:
        """Wait until the leader's Raft commit index is on its disk (pysyncobj saves it once a
        second): started again, it replays its journal up to there, where it leads "orders"."""
        member = self.cluster.members[self.index]
        url = f"http://{member.advertised}:{member.ports['metrics']}/metrics"
        (_, commit), = (await asyncio.to_thread(scrape, url))["riverlog_raft_commit_index"]
        path = os.path.join(self.cluster.directory, member.id, "raft", "journal.meta")

        async def saved() -> bool:
            try:
                with open(path, "rb") as f:
                    return pickle.load(f)["raftCommitIndex"] >= commit
            except (OSError, EOFError, KeyError, pickle.UnpicklingError):
                return False
        await until("the commit index saved", saved)

    async def __aenter__(self) -> "_Restart":
        self.cluster.start()
        try:
            await asyncio.to_thread(self.cluster.wait_registered)
            async with grpc.aio.insecure_channel(self.grpc_of["s0"]) as channel:
                await api_pb2_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(
                    name="orders", subject="orders", replicationFactor=3), timeout=30)
            self.old = await until("a leader", lambda: self.leader_seen_by("s0"))
            self.index = [m.id for m in self.cluster.members].index(self.old)
            await self.commit_index_saved()
            self.cluster.procs[self.index].kill()
            self.cluster.procs[self.index].wait()
            self.others = [m.id for m in self.cluster.members if m.id != self.old]
            await until("another leader", lambda: self.other_leader_seen_by(self.others[0]))
        except BaseException:
            self.cluster.stop()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        for proc in self.cluster.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        self.cluster.stop()


async def test_a_restarted_leader_leads_nothing_before_it_caught_up_with_raft(tmp_path):
    # A member starting again holds its streams' folders, and its Raft state (none yet, or
    # its journal replayed) names it the leader of the partition it led before its SIGKILL.
    # Until it has caught up with the Raft log it must take no write (the others elected
    # another leader meanwhile): here the two others are stopped, so it cannot catch up; a
    # LEADER publish it acked would be truncated once it follows the new leader.
    async with _Restart(str(tmp_path / "cluster")) as r:
        for i, proc in enumerate(r.cluster.procs):
            if i != r.index:
                proc.send_signal(signal.SIGSTOP)
        r.cluster.restart(r.index)
        await until("the restarted server serving",
                    lambda: with_stream(r.grpc_of[r.old], "orders"))
        async with grpc.aio.insecure_channel(r.grpc_of[r.old]) as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await api_pb2_grpc.APIStub(channel).Publish(pb.PublishRequest(
                    stream="orders", value=b"stale", ackPolicy=pb.LEADER), timeout=5)
        for i, proc in enumerate(r.cluster.procs):
            if i != r.index:
                proc.send_signal(signal.SIGCONT)
        assert await until("the restarted server caught up",
                           lambda: r.other_leader_seen_by(r.old)) in r.others


async def test_a_restarted_leader_acks_no_write_it_later_truncates(tmp_path):
    # The killed leader starts again while the others run: its Raft member replays its
    # journal, which names it the leader, before the Raft leader tells it what changed since.
    # LEADER publishes sent to it from the moment its gRPC port answers are taken only by the
    # current leader (forwarded through NATS once it caught up, refused before): every one
    # it acked is on the final leader. Before the fix it acked some in a stale epoch and
    # truncated them later.
    async with _Restart(str(tmp_path / "cluster")) as r:
        async with grpc.aio.insecure_channel(r.grpc_of[r.others[0]]) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            for i in range(10):  # Raft entries the restarted member has not seen
                await stub.CreateStream(pb.CreateStreamRequest(
                    name=f"pad{i}", subject=f"pad{i}", replicationFactor=1), timeout=30)
        r.cluster.restart(r.index)
        await until("the restarted server's gRPC port", lambda: metadata(r.grpc_of[r.old]))
        acked: list[bytes] = []
        stop = asyncio.Event()

        async def hammer() -> None:
            async with grpc.aio.insecure_channel(r.grpc_of[r.old]) as channel:
                stub = api_pb2_grpc.APIStub(channel)
                for attempt in itertools.count():
                    if stop.is_set():
                        return
                    value = b"h%d" % attempt
                    try:
                        await stub.Publish(pb.PublishRequest(
                            stream="orders", value=value, ackPolicy=pb.LEADER), timeout=5)
                    except grpc.aio.AioRpcError:
                        await asyncio.sleep(0.01)
                        continue
                    acked.append(value)
        task = asyncio.create_task(hammer())
        try:
            await until("the restarted server caught up",
                        lambda: r.other_leader_seen_by(r.old))
            enough = len(acked) + 20  # and acks through the current leader after that
            await until("acks after the catch-up", lambda: asyncio.sleep(0, len(acked) >= enough))
        finally:
            stop.set()
            await task
        leader = await r.other_leader_seen_by(r.others[0])

        async def all_committed():
            meta = await with_stream(r.grpc_of[leader], "orders")
            part = [s for s in meta.streamMetadata if s.name == "orders"][0].partitions[0]
            return part.highWatermark == part.newestOffset and part
        part = await until("every record committed", all_committed)
        stored = await values(r.grpc_of[leader], "orders", part.highWatermark)
        assert [v for v in acked if v not in stored] == []


def test_cluster_up_serves_metrics_where_its_table_says(tmp_path):
    # every door of a member listens on --host, /metrics too: on 127.0.0.2 (a loopback
    # address other than the default one) the table's metrics address answers
    proc = subprocess.Popen([sys.executable, "-m", "riverlog", "cluster", "up", "--servers",
                             "1", "-d", str(tmp_path / "cluster"), "--host", "127.0.0.2"],
                            stdout=subprocess.PIPE, text=True)
    try:
        rows = read_table(proc)
        assert rows["s0"]["metrics"].startswith("127.0.0.2:")
        with urllib.request.urlopen(f"http://{rows['s0']['metrics']}/metrics",
                                    timeout=WAIT_S) as response:
            assert b"riverlog_raft_leader" in response.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def test_an_advertised_host_the_doors_do_not_listen_on_is_refused(tmp_path):
    # the doors, the NATS routes and Raft would be told at an address nothing listens on
    # (before: the servers started, never reached each other, and `cluster up` timed out)
    with pytest.raises(ValueError, match="--advertise 10.1.2.3 .* --host 127.0.0.1"):
        LocalCluster(str(tmp_path / "refused"), 3, "127.0.0.1", "10.1.2.3")
    assert not (tmp_path / "refused").exists()
    for host, advertise in [("0.0.0.0", "10.1.2.3"), ("127.0.0.1", "127.0.0.1")]:
        (member,) = LocalCluster(str(tmp_path / host), 1, host, advertise).members
        assert member.advertised == advertise


def test_a_saved_layout_keeps_its_raft_ports(tmp_path):
    """The Raft members know each other by address, and keep it in their journals and
    snapshots (dynamic membership): a Raft port taken since the last `up` is a clear error,
    never silently replaced (the others would wait for the old address); any other port
    taken is replaced by a free one."""
    first = layout(str(tmp_path), 2, "127.0.0.1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first[0].ports["metrics"]))
        again = layout(str(tmp_path), 2, "127.0.0.1")
    assert again[0].ports["metrics"] != first[0].ports["metrics"]
    assert [m.ports["raft"] for m in again] == [m.ports["raft"] for m in first]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first[1].ports["raft"]))
        with pytest.raises(ValueError, match=f"the Raft port {first[1].ports['raft']} of server "
                                             f"s1 is taken"):
            layout(str(tmp_path), 2, "127.0.0.1")


def test_new_ports_are_picked_below_the_ephemeral_range(tmp_path):
    """A layout's ports are reused at the next start, and a Raft port cannot change: picked
    from the kernel's ephemeral range, any outgoing connection could hold it by then (CI
    saw `the Raft port 33125 of server s1 is taken` when `serve --workers` restarted)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    members = layout(str(tmp_path), 3, "127.0.0.1")
    ports = [p for m in members for p in m.ports.values()]
    assert len(set(ports)) == len(ports)
    assert all(10_000 <= p < low for p in ports), (low, ports)


def test_members_given_in_a_new_directory_get_their_commands(tmp_path):
    # LocalCluster(members=...) (fixed ports, nothing saved: liftbridge_side_by_side.py) in a
    # folder that does not exist yet: the first command made the Raft password file in it and
    # failed with FileNotFoundError (before the fix)
    members = [Member(f"s{i}", {name: 7100 + 10 * i + n for n, name in enumerate(
        ("stream", "grpc", "nats", "nats_cluster", "raft", "metrics"))}) for i in range(2)]
    cluster = LocalCluster(str(tmp_path / "new" / "cluster"), 2, members=members)
    _command, env = cluster.command(members[0])
    path = tmp_path / "new" / "cluster" / "raft-password"
    assert env["LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD"] == path.read_text().strip()
    assert path.stat().st_mode & 0o777 == 0o600


async def test_a_create_returns_once_every_replica_has_the_stream(cluster_up):
    # osiris' start_cluster returns once the writer and the replicas it could start run: a
    # client connecting to any replica a Metadata answer names right after a create (the Go
    # client's consumers pick replicas) finds the stream there. A follower that is neither
    # the Raft leader nor the new partition's leader is stopped: the create commits without
    # it but does not return while it is stopped (best effort: up to about 10 s), and once
    # it runs again the create returns only after it holds the stream. Before, only the
    # leaders were asked and the create returned at once.
    rows = read_table(cluster_up)
    servers = sorted(rows)
    grpc_of = {s: row["Liftbridge gRPC"] for s, row in rows.items()}
    meta = await until("__cursors in the metadata",
                       lambda: with_stream(grpc_of[servers[0]], "__cursors"))
    placed = sum(len(s.partitions) for s in meta.streamMetadata)
    new_leader = servers[placed % len(servers)]  # state.create_stream's round robin
    raft = await until("a Raft leader", lambda: asyncio.to_thread(raft_leader, rows))
    stopped = next(s for s in servers if s not in (raft, new_leader))
    asker = next(s for s in servers if s != stopped)
    proc = int(rows[stopped]["pid"])
    os.kill(proc, signal.SIGSTOP)
    try:
        async with grpc.aio.insecure_channel(grpc_of[asker]) as channel:
            create = asyncio.ensure_future(api_pb2_grpc.APIStub(channel).CreateStream(
                pb.CreateStreamRequest(name="fresh", subject="fresh", replicationFactor=3),
                timeout=60))
            done, _ = await asyncio.wait([create], timeout=3)
            assert not done, "the create returned while a replica was stopped"
            os.kill(proc, signal.SIGCONT)
            await create
        meta = await metadata(grpc_of[stopped])
        (fresh,) = [s for s in meta.streamMetadata if s.name == "fresh"]
        assert (fresh.error, fresh.partitions[0].leader) == (0, new_leader)
    finally:
        os.kill(proc, signal.SIGCONT)


def test_cluster_up_members_share_one_table_folder_and_catalog(tmp_path):
    # every member's `riverlog serve` command line, read as `serve` reads it, names the one
    # table folder DIR/tables and so the one Iceberg catalog (SQLite) in it
    from riverlog.cli import serve
    from riverlog.config_file import build, load
    from riverlog.tables.iceberg import catalog_uri
    members = layout(str(tmp_path), 3, "127.0.0.1")
    catalogs = set()
    for member in members:
        command, env = serve_command(member, members, str(tmp_path))
        flags = dict(serve.make_context("serve", command[command.index("serve") + 1:]).params)
        config_file = flags.pop("config_file")
        flags["nats_routes"] = [r for arg in flags["nats_routes"] for r in arg.split(",")]
        config, _ = build(load(config_file, {**os.environ, **env}), flags)
        assert config.data_dir == os.path.join(str(tmp_path), member.id)
        catalogs.add(catalog_uri(config.table_dir, config.tables.catalog))
    assert catalogs == {"sqlite:///" + str(tmp_path / "tables" / "catalog.db")}
