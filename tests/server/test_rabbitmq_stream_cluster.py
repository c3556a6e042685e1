"""The RabbitMQ Stream door in a cluster, as it sees one through ``Broker.placement``: a
placement the test scripts (who leads, who follows, where each server's doors are), installed
in in-process Apps after they started, with rstream and raw frames as the clients. The
cluster runtime itself (Raft, replication) is not in play: a replica's high watermark is
moved by hand (``CommitLog.commit``), as replication will move it."""
from __future__ import annotations

import asyncio

import pytest
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer
from rstream.exceptions import LeaderNotAvailable
from rstream.recovery import RecoveryStrategy

from compat._helpers import wait_until
from compat._raw import RawPeer
from riverlog.broker import StreamConfig
from riverlog.broker.placement import PartitionPlacement, Placement
from riverlog.broker.superstreams import SuperStream
from riverlog.errors import InvalidArgumentError, StreamExistsError, StreamNotFoundError
from riverlog.log.chunk import iter_records
from riverlog.protocol.rabbitmq_stream import ResponseCode, encode, simple_entry
from riverlog.protocol.rabbitmq_stream import frames as f

pytestmark = pytest.mark.timeout(60)
GUEST = {"username": "guest", "password": "guest"}
HOST = "127.0.0.1"
OK = ResponseCode.OK
NOT_AVAILABLE = ResponseCode.STREAM_NOT_AVAILABLE
NO_LEADER = 0xFFFF


class Cluster:
    """What every server of the scripted cluster agrees on: each partition's placement,
    each server's doors (server id -> door name -> (host, port)) and the super streams."""

    def __init__(self) -> None:
        self.partitions: dict[tuple[str, int], PartitionPlacement] = {}
        self.super_streams: dict[str, SuperStream] = {}
        self.doors: dict[str, dict[str, tuple[str, int]]] = {}
        self.members: list[ScriptedPlacement] = []
        self.created: list[tuple[str, StreamConfig]] = []

    def join(self, app, server_id: str) -> "ScriptedPlacement":
        """Install a placement for ``app`` as server ``server_id``, its door advertised."""
        self.doors[server_id] = {"rabbitmq-stream": (HOST, app.rabbitmq_stream.port)}
        placement = ScriptedPlacement(self, server_id, app.broker)
        app.broker.placement = placement
        self.members.append(placement)
        return placement

    def place(self, stream: str, leader: str | None, replicas: tuple[str, ...],
              isr: tuple[str, ...] | None = None, index: int = 0) -> None:
        """Set a partition's placement; a new leader is announced on every server."""
        before = self.partitions.get((stream, index))
        epoch = before.leader_epoch + (before.leader != leader) if before else 1
        self.partitions[(stream, index)] = PartitionPlacement(
            leader, replicas, replicas if isr is None else isr, epoch)
        if before is not None and before.leader != leader:
            for member in self.members:
                member.leader_changed(stream, index)


class ScriptedPlacement(Placement):
    """One server's view of ``Cluster``. Streams are created on the servers holding their
    replicas (every member), as the cluster runtime creates them."""

    clustered = True

    def __init__(self, cluster: Cluster, server_id: str, broker) -> None:
        super().__init__(server_id)
        self.cluster = cluster
        self.broker = broker
        self.hold: asyncio.Event | None = None  # create_stream waits for it when set
        self.entered = asyncio.Event()

    def of(self, stream: str, index: int) -> PartitionPlacement | None:
        return self.cluster.partitions.get((stream, index))

    def door(self, server_id: str, door: str) -> tuple[str, int] | None:
        return self.cluster.doors.get(server_id, {}).get(door)

    def servers(self) -> tuple[str, ...]:
        return tuple(sorted(self.cluster.doors))

    async def create_stream(self, name: str, config: StreamConfig) -> None:
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        if config.replication_factor > len(self.servers()):
            raise InvalidArgumentError("replication factor above the server count")
        if (name, 0) in self.cluster.partitions:
            raise StreamExistsError(name)
        self.cluster.created.append((name, config))
        for member in self.cluster.members:
            member.broker.create(name, config)
        for index in range(config.partitions):
            self.cluster.partitions[(name, index)] = PartitionPlacement(
                self.server_id, self.servers(), self.servers())

    async def delete_stream(self, name: str) -> None:
        if (name, 0) not in self.cluster.partitions:
            raise StreamNotFoundError(name)
        for key in [k for k in self.cluster.partitions if k[0] == name]:
            del self.cluster.partitions[key]
        for member in self.cluster.members:
            member.broker.delete(name)

    def super_streams(self) -> dict[str, SuperStream]:
        return self.cluster.super_streams

    async def create_super_stream(self, name: str, partitions: tuple[str, ...],
                                  binding_keys: tuple[str, ...]) -> None:
        if name in self.cluster.super_streams:
            raise StreamExistsError(name)
        self.cluster.super_streams[name] = SuperStream(name, partitions, binding_keys)

    async def delete_super_stream(self, name: str) -> None:
        if self.cluster.super_streams.pop(name, None) is None:
            raise StreamNotFoundError(name)

    async def create_super_stream_with_streams(self, name: str, partitions: tuple[str, ...],
                                               binding_keys: tuple[str, ...],
                                               config: StreamConfig) -> None:
        if name in self.cluster.super_streams:  # the cluster's one entry, scripted
            raise StreamExistsError(name)
        for partition in partitions:
            await self.create_stream(partition, config)
        await self.create_super_stream(name, partitions, binding_keys)

    async def delete_super_stream_with_streams(self, name: str) -> None:
        found = self.cluster.super_streams.get(name)
        await self.delete_super_stream(name)
        for partition in found.partitions:
            await self.delete_stream(partition)


@pytest.fixture
def cluster():
    return Cluster()


async def peer_for(app) -> RawPeer:
    return await RawPeer.open(HOST, app.rabbitmq_stream.port)


async def test_metadata_lists_the_leader_and_the_in_sync_followers_where_they_listen(
        app, cluster):
    cluster.join(app, "a")
    cluster.doors["b"] = {"rabbitmq-stream": ("b.example", 5552)}
    cluster.doors["c"] = {"rabbitmq-stream": ("c.example", 5553)}
    app.broker.create("here")
    cluster.place("here", "b", ("a", "b", "c"))
    cluster.place("elsewhere", "b", ("b", "c"), isr=("b",))  # no replica on a; c behind
    app.broker.create("leaderless")
    cluster.place("leaderless", None, ("a", "b"), isr=("a",))
    peer = await peer_for(app)
    md = await peer.request(f.Metadata(peer.next_corr(),
                                       ("here", "elsewhere", "leaderless", "nowhere")))
    a = (HOST, app.rabbitmq_stream.port)
    assert [(b.reference, b.host, b.port) for b in md.brokers] == [
        (0, *a), (1, "b.example", 5552), (2, "c.example", 5553)]
    assert [(s.name, s.response_code, s.leader_reference, s.replica_references)
            for s in md.streams] == [
        ("here", OK, 1, (0, 2)),
        ("elsewhere", OK, 1, ()),
        ("leaderless", OK, NO_LEADER, (0,)),
        ("nowhere", ResponseCode.STREAM_DOES_NOT_EXIST, NO_LEADER, ())]
    async with Producer(HOST, app.rabbitmq_stream.port, **GUEST) as producer:
        client = await producer.default_client
        leader, replicas = await client.query_leader_and_replicas("here")
        assert (leader.host, leader.port) == ("b.example", 5552)
        assert {(r.host, r.port) for r in replicas} == {a, ("c.example", 5553)}
        with pytest.raises(LeaderNotAvailable):
            await client.query_leader_and_replicas("leaderless")


async def test_publishers_are_refused_where_another_server_leads(app, cluster):
    cluster.join(app, "a")
    cluster.doors["b"] = {"rabbitmq-stream": ("b.example", 5552)}
    app.broker.create("follower-here")
    cluster.place("follower-here", "b", ("b", "a"))
    cluster.place("elsewhere", "b", ("b",))
    peer = await peer_for(app)
    for stream in ("follower-here", "elsewhere"):
        r = await peer.request(f.DeclarePublisher(peer.next_corr(), 1, "", stream))
        assert r.response_code == NOT_AVAILABLE, stream
    # consumers may read the local replica; a stream without one here is not available
    r = await peer.request(f.Subscribe(peer.next_corr(), 1, "follower-here", 1, None, 1, None))
    assert r.response_code == OK
    r = await peer.request(f.Subscribe(peer.next_corr(), 2, "elsewhere", 1, None, 1, None))
    assert r.response_code == NOT_AVAILABLE
    r = await peer.request(f.Subscribe(peer.next_corr(), 2, "nowhere", 1, None, 1, None))
    assert r.response_code == ResponseCode.STREAM_DOES_NOT_EXIST
    assert app.broker.get("follower-here").partitions[0].next_offset == 0


class Recovered(RecoveryStrategy):
    """rstream's recovery after a MetadataUpdate or a lost connection: asks Metadata again
    at once (its default waits 1 to 8 s first) and records the leader it got."""

    def __init__(self) -> None:
        super().__init__()
        self.leaders: list[tuple[str, int]] = []
        self.done = asyncio.Event()

    async def recover(self, entity, stream, error, attempt, recovery_fun) -> None:
        leader, _ = await recovery_fun()
        self.leaders.append((leader.host, leader.port))
        self.done.set()


async def test_a_leader_change_sends_rstream_publishers_to_the_new_leader(app_factory, cluster):
    a, b = await app_factory(), await app_factory()
    cluster.join(a, "a")
    cluster.join(b, "b")
    for app in (a, b):
        app.broker.create("moving")
    cluster.place("moving", "a", ("a", "b"))
    recovery = Recovered()
    async with Producer(HOST, b.rabbitmq_stream.port, **GUEST,
                        recovery_strategy=recovery) as producer:
        await producer.send_wait("moving", b"to a")  # rstream asks b, publishes on a
        raw = await peer_for(a)
        r = await raw.request(f.DeclarePublisher(raw.next_corr(), 7, "", "moving"))
        assert r.response_code == OK
        r = await raw.request(f.Subscribe(raw.next_corr(), 1, "moving", 1, None, 10, None))
        assert r.response_code == OK

        cluster.place("moving", "b", ("a", "b"))
        await asyncio.wait_for(recovery.done.wait(), 10)
        assert recovery.leaders == [(HOST, b.rabbitmq_stream.port)]
        await producer.send_wait("moving", b"to b")

    update = await raw.recv_until(f.MetadataUpdate)
    assert (update.stream, update.response_code) == ("moving", NOT_AVAILABLE)
    raw.send(f.Publish(7, ((1, simple_entry(b"old publisher")),)))
    raw.send(f.Credit(1, 1))
    raw.send(f.Metadata(raw.next_corr(), ("moving",)))
    after: list = []
    md = await raw.recv_until(f.MetadataResponse, keep=after)
    # one MetadataUpdate per stream and connection; its publisher and subscription are gone
    assert [type(frame) for frame in after if not isinstance(frame, f.Deliver)] == [
        f.PublishError, f.CreditResponse]
    assert after[-2].errors == ((1, ResponseCode.PUBLISHER_DOES_NOT_EXIST),)
    assert after[-1].response_code == ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST
    leader = {br.reference: br.port for br in md.brokers}[md.streams[0].leader_reference]
    assert leader == b.rabbitmq_stream.port
    r = await raw.request(f.DeclarePublisher(raw.next_corr(), 7, "", "moving"))
    assert r.response_code == NOT_AVAILABLE
    assert _records(a, "moving") == [b"to a"]
    assert _records(b, "moving") == [b"to b"]


def _records(app, stream: str, index: int = 0) -> list[bytes]:
    """Every record of the partition, committed or not."""
    log = app.broker.get(stream).partitions[index].log
    return [record for chunk in log.read_chunks(0, 1 << 20, committed_only=False)
            for _, record in iter_records(chunk.header, chunk.data)]


async def test_a_consumer_on_a_replica_gets_committed_chunks_only(app, cluster):
    """rstream subscribes on the replica Metadata names (this server); of the chunks the
    follower holds only the committed ones are delivered: a tail that is never committed
    (cut when the follower truncates to a new leader's log) never reaches the consumer."""
    cluster.join(app, "a")
    cluster.doors["b"] = {"rabbitmq-stream": ("b.example", 5552)}
    partition = app.broker.create("followed", StreamConfig(replicated=True)).partitions[0]
    cluster.place("followed", "b", ("b", "a"))
    first = partition.write_records([b"one", b"two"])
    tail = partition.write_records([b"never committed"])
    partition.log.commit(first[-1])
    got: list[bytes] = []
    async with Consumer(HOST, app.rabbitmq_stream.port, **GUEST) as consumer:
        await consumer.subscribe(
            "followed", lambda message, context: got.append(message), decoder=bytes,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await wait_until(lambda: len(got) >= 2, 10, "the committed chunk")
        partition.log.truncate(tail.start)
        partition.log.commit(partition.write_records([b"three"])[-1])
        await wait_until(lambda: len(got) >= 3, 10, "the chunk committed next")
    assert got == [b"one", b"two", b"three"]


async def test_a_leader_confirms_only_what_is_committed(app, cluster):
    cluster.join(app, "a")
    cluster.doors["b"] = {"rabbitmq-stream": ("b.example", 5552)}
    partition = app.broker.create("led", StreamConfig(replicated=True)).partitions[0]
    cluster.place("led", "a", ("a", "b"))
    peer = await peer_for(app)
    r = await peer.request(f.DeclarePublisher(peer.next_corr(), 1, "", "led"))
    assert r.response_code == OK
    peer.send(f.Publish(1, tuple((i, simple_entry(b"m%d" % i)) for i in range(3))))
    await wait_until(lambda: partition.next_offset == 3, 10, "the chunk written")
    # a confirm sent with the write would arrive before the answer to a later request
    peer.send(f.Metadata(peer.next_corr(), ("led",)))
    before: list = []
    await peer.recv_until(f.MetadataResponse, keep=before)
    assert not [frame for frame in before if isinstance(frame, f.PublishConfirm)]
    partition.log.commit(2)  # the followers caught up
    confirm = await peer.recv_until(f.PublishConfirm)
    assert confirm.publishing_ids == (0, 1, 2)


async def test_create_and_delete_go_through_the_placement(app, cluster):
    placement = cluster.join(app, "a")
    cluster.doors["b"] = {"rabbitmq-stream": ("b.example", 5552)}
    cluster.doors["c"] = {"rabbitmq-stream": ("c.example", 5553)}
    peer = await peer_for(app)
    assert await peer.create("all") == OK
    assert await peer.create("two", {"initial-cluster-size": "2"}) == OK
    assert await peer.create("capped", {"initial-cluster-size": "9"}) == OK
    assert await peer.create("bad", {"initial-cluster-size": "0"}) == ResponseCode.PRECONDITION_FAILED
    assert await peer.create("two", {"initial-cluster-size": "2"}) == \
        ResponseCode.STREAM_ALREADY_EXISTS
    # other arguments (one missing counts): precondition failed, as RabbitMQ answers
    assert await peer.create("two") == ResponseCode.PRECONDITION_FAILED
    # RabbitMQ: every member by default, never more than there are
    assert [(name, config.replication_factor) for name, config in cluster.created] == [
        ("all", -1), ("two", 2), ("capped", 3)]
    r = await peer.request(f.CreateSuperStream(peer.next_corr(), "super", ("super-0", "super-1"),
                                               ("0", "1"), {"initial-cluster-size": "2"}))
    assert r.response_code == OK
    assert [(name, config.replication_factor) for name, config in cluster.created[3:]] == [
        ("super-0", 2), ("super-1", 2)]
    assert cluster.super_streams["super"].partitions == ("super-0", "super-1")  # the cluster's

    # frames behind a Create wait for it: the Metadata is answered after the stream exists
    placement.hold = asyncio.Event()
    placement.entered.clear()
    peer.send_bytes(encode(f.Create(peer.next_corr(), "held", {})) +
                    encode(f.Metadata(peer.next_corr(), ("held",))))
    await asyncio.wait_for(placement.entered.wait(), 10)
    placement.hold.set()
    created = await peer.recv_until(f.CreateResponse)
    md = await peer.recv_until(f.MetadataResponse)
    assert (created.response_code, md.streams[0].response_code) == (OK, OK)

    assert await peer.delete("two") == OK
    assert ("two", 0) not in cluster.partitions and "two" not in app.broker.streams
    r = await peer.request(f.DeleteSuperStream(peer.next_corr(), "super"))
    assert r.response_code == OK
    assert not {"super-0", "super-1"} & set(app.broker.streams)
    assert await peer.delete("two") == ResponseCode.STREAM_DOES_NOT_EXIST


async def test_a_delete_through_the_placement_answers_before_the_metadata_update(app, cluster):
    """As rabbit_stream_reader.erl: response_ok, then metadata_update (issue 20, item 7),
    also when the deletion goes through the cluster and the stream's replicas go meanwhile."""
    cluster.join(app, "a")
    peer = await peer_for(app)
    assert await peer.create("consumed") == OK
    r = await peer.request(f.Subscribe(peer.next_corr(), 1, "consumed", 1, None, 10, None))
    assert r.response_code == OK
    peer.send(f.Delete(peer.next_corr(), "consumed"))
    before: list = []
    deleted = await peer.recv_until(f.DeleteResponse, keep=before)
    assert deleted.response_code == OK
    assert not [frame for frame in before if isinstance(frame, f.MetadataUpdate)], before
    update = await peer.recv_until(f.MetadataUpdate)
    assert (update.stream, update.response_code) == ("consumed", NOT_AVAILABLE)


async def test_publishes_are_not_written_once_another_server_leads(app, cluster):
    """The placement may name a new leader before its leader change is announced: what a
    publisher sends meanwhile is refused with 0x06, never written on the follower."""
    cluster.join(app, "a")
    cluster.doors["b"] = {"rabbitmq-stream": ("b.example", 5552)}
    partition = app.broker.create("moved").partitions[0]
    cluster.place("moved", "a", ("a", "b"))
    peer = await peer_for(app)
    r = await peer.request(f.DeclarePublisher(peer.next_corr(), 1, "", "moved"))
    assert r.response_code == OK
    cluster.partitions[("moved", 0)] = PartitionPlacement("b", ("a", "b"), ("a", "b"), 2)
    peer.send(f.Publish(1, ((5, simple_entry(b"late")),)))
    error = await peer.recv_until(f.PublishError)
    assert error.errors == ((5, NOT_AVAILABLE),)
    assert partition.next_offset == 0
