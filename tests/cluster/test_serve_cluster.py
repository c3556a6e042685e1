# `riverlog serve` as a cluster member: three real Apps in this process (each with its Raft
# member, its embedded nats-server routed to the others', every door on free ports), driven
# by real Liftbridge clients (riverlog's generated gRPC stub, gufo-liftbridge) and nats-py:
# a stream created through any server exists on every replica with one leader, FetchMetadata
# tells the same everywhere, only the leader ingests its subject, a publish reaching a follower
# goes to the leader through NATS (as Liftbridge's api.go publishes every gRPC Publish), a
# follower refuses Subscribe as Liftbridge does, a running Subscribe ends where its server
# stops leading, a delete reaches every server, a member rejoining without its Raft files
# keeps its replicas. No mocks.
from __future__ import annotations

import asyncio
import os
import shutil

import grpc
import nats
import pytest

from _apps import IDS, created, replica_bytes, started, stopped, stub_of, until
from compat._servers import HOST
from riverlog.config import SecurityConfig
from riverlog.metrics import CLUSTER_REGISTRY
from riverlog.cluster.state import StaleLeaderEpoch
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.envelope import decode_ack, encode_publish
from riverlog.security.users import hash_password
from riverlog.server.app import App
from riverlog.server.nats_link import settle


async def test_a_stream_made_through_any_server_is_on_every_replica(cluster):
    a, b, c = cluster
    channels = [stub_of(app) for app in cluster]
    stubs = [s for _, s in channels]
    try:
        await stubs[1].CreateStream(pb.CreateStreamRequest(
            name="orders", subject="orders", replicationFactor=3,
            minIsr=pb.NullableInt32(value=2)), timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stubs[2].CreateStream(pb.CreateStreamRequest(
                name="orders", subject="orders"), timeout=30)
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stubs[0].CreateStream(pb.CreateStreamRequest(
                name="big", subject="big", replicationFactor=4), timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == "Invalid replicationFactor 4, cluster size 3"
        await until("every server holds orders", lambda: all(
            "orders" in app.broker.streams for app in cluster))
        assert all(app.broker.streams["orders"].config.min_isr == 2 for app in cluster)

        # brokers lists the servers each one's Raft member is in touch with now (Liftbridge's
        # fetchBrokerInfo: those answering its survey): a connection dropped under load
        # leaves one out for a moment, so ask until every answer lists all three
        every = [(app.config.cluster.server_id, app.grpc.port) for app in cluster]

        async def answers_listing_every_server():
            answers = [await s.FetchMetadata(pb.FetchMetadataRequest(streams=["orders"]),
                                             timeout=10) for s in stubs]
            return answers if all([(br.id, br.port) for br in answer.brokers] == every
                                  for answer in answers) else None
        answers = await until("every answer lists every server", answers_listing_every_server)
        for answer in answers:
            (meta,) = answer.streamMetadata
            part = meta.partitions[0]
            assert (meta.name, sorted(part.replicas), sorted(part.isr)) == (
                "orders", list(IDS), list(IDS))
        leaders = {answer.streamMetadata[0].partitions[0].leader for answer in answers}
        assert len(leaders) == 1
        leader_id = leaders.pop()
        index = IDS.index(leader_id)
        leader, followers = cluster[index], [x for x in cluster if x is not cluster[index]]

        # publish to the leader: stored there; to a follower: through NATS to the leader
        ack = (await stubs[index].Publish(pb.PublishRequest(
            stream="orders", value=b"one", ackPolicy=pb.AckPolicy.LEADER), timeout=10)).ack
        assert ack.offset == 0
        follower_stub = stubs[IDS.index(followers[0].config.cluster.server_id)]
        ack = (await follower_stub.Publish(pb.PublishRequest(
            stream="orders", value=b"two", ackPolicy=pb.AckPolicy.LEADER), timeout=10)).ack
        assert (ack.stream, ack.offset) == ("orders", 1)
        assert leader.broker.streams["orders"].partitions[0].next_offset == 2
        # the followers fetch the leader's chunks: same offsets, same bytes
        await until("both followers hold what the leader holds", lambda: all(
            f.broker.streams["orders"].partitions[0].committed_offset == 1 for f in followers))
        assert all(replica_bytes(f, "orders") == replica_bytes(leader, "orders")
                   for f in followers)

        # only the leader listens on the subject: a plain NATS publish is stored once
        nc = await nats.connect(followers[1].nats.url)
        inbox = "_INBOX.acks"
        sub = await nc.subscribe(inbox)
        await nc.publish("orders", encode_publish(pb.Message(
            value=b"three", ackInbox=inbox, ackPolicy=pb.AckPolicy.LEADER)))
        assert decode_ack((await sub.next_msg(timeout=10)).data).offset == 2
        # a client without credentials is nats-server's restricted anonymous user: riverlog's
        # own subjects are out of its reach
        errors = []

        async def on_error(exc):
            errors.append(str(exc).lower())
        nc2 = await nats.connect(followers[1].nats.url, error_cb=on_error)
        await nc2.subscribe(f"{leader.liftbridge.namespace}.notify.{leader_id}")
        await nc2.publish(f"{leader.liftbridge.namespace}.orders.0.replicate", b"x")
        await settle(nc2)
        await until("both refusals", lambda: len(errors) >= 2)
        assert "permissions violation for subscription" in errors[0]
        assert "permissions violation for publish" in errors[1]
        await nc2.close()
        await nc.close()

        async def requests():  # PublishAsync on a follower: each one to the leader
            for i, policy in enumerate((pb.AckPolicy.LEADER, pb.AckPolicy.NONE,
                                        pb.AckPolicy.LEADER)):
                yield pb.PublishRequest(stream="orders", value=b"async%d" % i,
                                        correlationId=f"c{i}", ackPolicy=policy)
        answers = [r async for r in follower_stub.PublishAsync(requests(), timeout=10)]
        assert [(r.correlationId, r.ack.offset, r.HasField("asyncError")) for r in answers] == [
            ("c0", 3, False), ("c2", 5, False)]
        assert leader.broker.streams["orders"].partitions[0].next_offset == 6
        await until("the followers hold offsets 0-5", lambda: all(
            f.broker.streams["orders"].partitions[0].committed_offset == 5 for f in followers))

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await anext(follower_stub.Subscribe(pb.SubscribeRequest(stream="orders"),
                                                timeout=10).__aiter__())
        assert (refused.value.code(), refused.value.details()) == (
            grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader")
        # readISRReplica: the follower serves its own replica, first with Liftbridge's empty
        # handshake message, then the records it replicated
        call = follower_stub.Subscribe(pb.SubscribeRequest(
            stream="orders", readISRReplica=True,
            startPosition=pb.StartPosition.EARLIEST), timeout=10)
        received = call.__aiter__()
        assert await anext(received) == pb.Message()
        assert [(await anext(received)).value for _ in range(3)] == [b"one", b"two", b"three"]
        call.cancel()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await follower_stub.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(
                stream="orders"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        # a stream without a replica on a server is still in its FetchMetadata
        await stubs[0].CreateStream(pb.CreateStreamRequest(name="one", subject="one"),
                                    timeout=30)
        await until("one applied everywhere", lambda: all(
            app.broker.placement.of("one", 0) is not None for app in cluster))
        (holder,) = [app for app in cluster if "one" in app.broker.streams]
        other = stubs[cluster.index(next(app for app in cluster if app is not holder))]
        (meta,) = (await other.FetchMetadata(pb.FetchMetadataRequest(streams=["one"]),
                                             timeout=10)).streamMetadata
        part = meta.partitions[0]
        assert (meta.subject, part.leader, list(part.replicas)) == (
            "one", holder.config.cluster.server_id, [holder.config.cluster.server_id])
        ack = (await other.Publish(pb.PublishRequest(  # no replica here: to the leader too
            stream="one", value=b"v", ackPolicy=pb.AckPolicy.LEADER), timeout=10)).ack
        assert (ack.stream, ack.offset) == ("one", 0)

        await follower_stub.DeleteStream(pb.DeleteStreamRequest(name="orders"), timeout=30)
        await until("orders gone everywhere", lambda: all(
            "orders" not in app.broker.streams for app in cluster))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stubs[0].DeleteStream(pb.DeleteStreamRequest(name="orders"), timeout=30)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        for channel, _ in channels:
            await channel.close()


async def test_a_new_leader_takes_the_nats_subject_over(cluster):
    """After a leader change (Raft's change_leader) the new leader listens on the subject
    and the old one no longer does: NATS publishes are stored on the new leader only."""
    a = cluster[0]
    channel, stub = stub_of(a)
    nc = await nats.connect(cluster[2].nats.url)
    try:
        await stub.CreateStream(pb.CreateStreamRequest(name="moves", subject="moves",
                                                       replicationFactor=3), timeout=30)
        await until("moves everywhere", lambda: all("moves" in app.broker.streams
                                                    for app in cluster))
        inbox = "_INBOX.moves"
        sub = await nc.subscribe(inbox)

        async def publish(value: bytes) -> int:  # ALL: every in-sync replica holds it
            await nc.publish("moves", encode_publish(pb.Message(
                value=value, ackInbox=inbox, ackPolicy=pb.AckPolicy.ALL)))
            return decode_ack((await sub.next_msg(timeout=10)).data).offset

        old = a.broker.placement.of("moves", 0).leader
        assert await publish(b"before") == 0
        await a.broker.placement.submit("change_leader", stream="moves", index=0)
        def agreed_new_leader():
            leaders = {app.broker.placement.of("moves", 0).leader for app in cluster}
            return len(leaders) == 1 and old not in leaders and leaders.pop()
        new = await until("one new leader everywhere", agreed_new_leader)
        new_app, old_app = cluster[IDS.index(new)], cluster[IDS.index(old)]
        await new_app.nats.sync()  # its SUB, and the old leader's UNSUB, are in effect
        await old_app.nats.sync()
        assert await publish(b"after") == 1  # stored once, by the new leader, after "before"
        assert new_app.broker.streams["moves"].partitions[0].next_offset == 2
        await until("the old leader follows the new one", lambda: old_app.broker.streams[
            "moves"].partitions[0].committed_offset == 1)
        assert replica_bytes(old_app, "moves") == replica_bytes(new_app, "moves")
    finally:
        await nc.close()
        await channel.close()


async def subscribed(stub, stream: str, first: bytes, read_isr: bool):
    """A Subscribe to partition 0 of ``stream`` from the earliest offset (``read_isr``:
    readISRReplica), past Liftbridge's empty handshake message and its first record, which
    must be ``first``; the async iterator of the messages after it."""
    call = stub.Subscribe(pb.SubscribeRequest(
        stream=stream, startPosition=pb.StartPosition.EARLIEST, readISRReplica=read_isr),
        timeout=20)
    messages = call.__aiter__()
    assert await anext(messages) == pb.Message()  # the handshake
    assert (await anext(messages)).value == first
    return messages


async def test_a_running_subscribe_ends_when_its_server_stops_leading(cluster):
    """A leader change ends the Subscribes its old leader serves with Unavailable "Server
    not partition leader" (where Liftbridge clients resubscribe at the leader), a
    readISRReplica one included (the old leader leaves the ISR); a readISRReplica Subscribe on
    a follower still in the ISR goes on. gufo-liftbridge, subscribed through the old leader,
    goes on at the new one with no gap and no duplicate."""
    from gufo.liftbridge.client import LiftbridgeClient
    from gufo.liftbridge.types import StartPosition
    placed = await created(cluster, "moving", subject="moving", replication_factor=3)
    old = cluster[IDS.index(placed.leader)]
    stays, new = [x for x in cluster if x is not old]
    channels = {app: stub_of(app) for app in cluster}

    async def publish(value: bytes) -> None:  # ALL: every in-sync replica holds it
        leader = next(a for a in cluster if a.broker.placement.leads("moving", 0))
        await channels[leader][1].Publish(pb.PublishRequest(
            stream="moving", value=value, ackPolicy=pb.AckPolicy.ALL), timeout=10)

    got: list[bytes] = []

    async def gufo() -> None:
        async with LiftbridgeClient([f"127.0.0.1:{old.grpc.port}"]) as client:
            async for message in client.subscribe("moving",
                                                  start_position=StartPosition.EARLIEST):
                got.append(message.value)
    try:
        await publish(b"before")
        on_leader = await subscribed(channels[old][1], "moving", b"before", False)
        isr_on_leader = await subscribed(channels[old][1], "moving", b"before", True)
        isr_on_follower = await subscribed(channels[stays][1], "moving", b"before", True)
        reader = asyncio.create_task(gufo())
        await until("gufo read the first record", lambda: got == [b"before"])
        await old.broker.placement.submit("change_leader", stream="moving", index=0,
                                          leader=new.config.cluster.server_id)
        for ended in (on_leader, isr_on_leader):
            with pytest.raises(grpc.aio.AioRpcError) as stopped:
                await anext(ended)
            assert (stopped.value.code(), stopped.value.details()) == (
                grpc.StatusCode.UNAVAILABLE, "Server not partition leader")
        await until("one new leader everywhere", lambda: all(
            x.broker.placement.of("moving", 0).leader == new.config.cluster.server_id
            for x in cluster))
        for i in range(3):
            await publish(b"after%d" % i)
        assert [(await anext(isr_on_follower)).value for _ in range(3)] == [
            b"after0", b"after1", b"after2"]
        await until("gufo read on at the new leader", lambda: len(got) >= 4)
        reader.cancel()
        assert got == [b"before", b"after0", b"after1", b"after2"]
    finally:
        for channel, _ in channels.values():
            await channel.close()


async def test_a_read_isr_replica_subscribe_ends_when_its_server_leaves_the_isr(cluster):
    """A readISRReplica Subscribe on a follower is served while the follower is in the ISR;
    when it leaves the ISR (no leader change) the Subscribe ends with Unavailable "Server
    not partition leader", where clients resubscribe where the partition is in sync; one on
    the other follower, still in the ISR, goes on."""
    placed = await created(cluster, "lagging", subject="lagging", replication_factor=3)
    leader = cluster[IDS.index(placed.leader)]
    leaving, staying = [x for x in cluster if x is not leader]
    channels = {app: stub_of(app) for app in cluster}
    try:
        await channels[leader][1].Publish(pb.PublishRequest(
            stream="lagging", value=b"first", ackPolicy=pb.AckPolicy.ALL), timeout=10)
        ends, goes_on = [await subscribed(channels[app][1], "lagging", b"first", True)
                         for app in (leaving, staying)]
        await leader.cluster.shrink_isr("lagging", 0, leaving.config.cluster.server_id,
                                        placed.leader_epoch)
        with pytest.raises(grpc.aio.AioRpcError) as stopped:
            await anext(ends)
        assert (stopped.value.code(), stopped.value.details()) == (
            grpc.StatusCode.UNAVAILABLE, "Server not partition leader")
        await channels[leader][1].Publish(pb.PublishRequest(
            stream="lagging", value=b"second", ackPolicy=pb.AckPolicy.ALL), timeout=10)
        assert (await anext(goes_on)).value == b"second"
    finally:
        for channel, _ in channels.values():
            await channel.close()


async def test_a_member_without_its_raft_files_deletes_no_replica_while_catching_up(cluster):
    """The documented way back from a damaged Raft file: remove DATA/raft and restart; the
    member rejoins empty and replays the whole metadata. The states before a stream's
    creation lack it, but a replica it holds is not deleted for that: it deletes nothing
    before it caught up (before, pysyncobj's isReady turned true while older states were
    still queued on the loop, and the replica was deleted and made again, empty)."""
    await created(cluster, "kept", subject="kept", replication_factor=3)
    member = cluster[2]
    await member.stop()
    shutil.rmtree(os.path.join(member.config.data_dir, "raft"))
    again = cluster[2] = App(member.config)
    deleted: list[str] = []
    again.broker.deletion_listeners.append(lambda stream: deleted.append(stream.name))
    await again.start()
    await until("caught up", lambda: again.broker.placement.caught_up)
    assert "kept" in again.broker.streams and deleted == []


async def test_a_replica_deleted_and_added_again_keeps_its_records_through_a_restart(cluster):
    """A member restarting replays its Raft journal before it is caught up; a journal with
    delete_replica and then add_replica of one partition on this server made the replay
    delete the local copy and make it again empty (then elected with nothing, had the
    leader gone). Here the old leader is down while the member replays, so nothing refills
    the copy: it must still hold every record. Before caught up, a replica left out is kept
    (and its records); whether it is gone for good is decided once caught up."""
    placed = await created(cluster, "moved", subject="moved", replication_factor=3)
    by_id = {app.config.cluster.server_id: app for app in cluster}
    leader = by_id[placed.leader]
    member = next(app for app in cluster if app is not leader)
    mid = member.config.cluster.server_id
    channel, stub = stub_of(leader)
    try:
        for i in range(10):
            await stub.Publish(pb.PublishRequest(stream="moved", value=b"%d" % i,
                                                 ackPolicy=pb.AckPolicy.ALL), timeout=10)
    finally:
        await channel.close()
    placement = leader.broker.placement
    await placement.submit("delete_replica", stream="moved", index=0, server=mid)
    await until("the member's copy gone", lambda: "moved" not in member.broker.streams)
    await placement.submit("add_replica", stream="moved", index=0, server=mid)
    await until("the member in sync again", lambda: "moved" in member.broker.streams and (
        member.broker.streams["moved"].partitions[0].next_offset == 10)
        and mid in placement.of("moved", 0).isr)
    await member.stop()
    await leader.stop()
    index = cluster.index(member)
    again = cluster[index] = App(member.config)
    await again.start()
    await until("caught up", lambda: again.broker.placement.caught_up)
    await asyncio.sleep(1)  # a reset the replay queued would have run by now
    assert again.broker.streams["moved"].partitions[0].next_offset == 10


async def test_replication_events_change_the_metadata_everywhere(cluster):
    """What replication asks (ClusterNode as ReplicationEvents): ISR shrink and expand under
    the leader epoch, and a leader reported by both followers (Liftbridge's quorum: more
    than (ISR - 1) / 2) is replaced; a stale report is refused."""
    placed = await created(cluster, "events", subject="events", replication_factor=3)
    leader = cluster[IDS.index(placed.leader)]
    first, second = [x for x in cluster if x is not leader]
    follower = first.config.cluster.server_id
    shrinks = CLUSTER_REGISTRY.get_sample_value("riverlog_isr_shrinks_total")
    await leader.cluster.shrink_isr("events", 0, follower, placed.leader_epoch)
    # applied by every member, each counting it: the leader's replication may take the
    # caught-up follower back at once (a Raft change takes milliseconds), too soon for the
    # shrunk ISR to be seen on all three at one poll (CI)
    await until("ISR shrunk everywhere", lambda: CLUSTER_REGISTRY.get_sample_value(
        "riverlog_isr_shrinks_total") >= shrinks + 3)
    await leader.cluster.expand_isr("events", 0, follower, placed.leader_epoch)
    await until("ISR expanded everywhere", lambda: all(
        follower in x.broker.placement.of("events", 0).isr for x in cluster))
    await first.cluster.report_leader("events", 0, placed.leader, placed.leader_epoch)
    assert first.broker.placement.of("events", 0).leader == placed.leader  # one of two
    await second.cluster.report_leader("events", 0, placed.leader, placed.leader_epoch)
    await until("a new leader everywhere", lambda: all(
        x.broker.placement.of("events", 0).leader not in (None, placed.leader)
        and x.broker.placement.of("events", 0).leader_epoch == placed.leader_epoch + 1
        for x in cluster))
    with pytest.raises(StaleLeaderEpoch):
        await first.cluster.report_leader("events", 0, placed.leader, placed.leader_epoch)


async def test_spark_connections_go_where_the_stream_lives(cluster):
    """The Spark source's connections (Connection.connect_for, through the RabbitMQ Stream
    door's Metadata): a writer starting at a server without a replica moves to the leader, a
    reader to a server holding one, and what the writer stores the reader reads back."""
    from riverlog.client import OffsetType
    from riverlog.record import Record, decode_record, encode_record
    from riverlog.spark.options import Connection
    placed = await created(cluster, "sparked", subject="sparked", replication_factor=2)
    (outsider,) = [x for x in cluster if x.config.cluster.server_id not in placed.replicas]
    leader = cluster[IDS.index(placed.leader)]
    start_at = Connection(servers=((HOST, outsider.rabbitmq_stream.port),))

    def write_and_read() -> tuple[tuple[str, int], tuple[str, int], list[bytes]]:
        with start_at.connect_for("sparked", write=True) as writer:
            publisher = writer.publisher("sparked", "spark-test")
            publisher.publish([encode_record(Record(b"v%d" % i)) for i in range(10)])
            publisher.flush()
            wrote_at = writer.server_address
        with start_at.connect_for("sparked", write=False) as reader:
            sub = reader.subscribe("sparked", OffsetType.FIRST, credit=10)
            values = []
            while len(values) < 10:
                for chunk in sub.next_chunks(10, 10):
                    values.extend(decode_record(r).value for _, r in chunk.records())
            return wrote_at, reader.server_address, values

    wrote_at, read_at, values = await asyncio.to_thread(write_and_read)
    assert wrote_at == leader.rabbitmq_stream.advertised_for(False)
    assert read_at in [cluster[IDS.index(r)].rabbitmq_stream.advertised_for(False)
                       for r in placed.replicas]
    assert values == [b"v%d" % i for i in range(10)]


async def test_below_min_isr_nothing_commits_and_all_acks_are_refused(cluster):
    """minIsr as Liftbridge's: once the ISR is smaller, the leader's high watermark stops
    (a LEADER-acked record is stored but not committed) and a publish asking ALL is refused
    at once."""
    placed = await created(cluster, "guarded", subject="guarded", replication_factor=2,
                           min_isr=2)
    leader = cluster[IDS.index(placed.leader)]
    (follower_id,) = [r for r in placed.replicas if r != placed.leader]
    follower = cluster[IDS.index(follower_id)]
    channel, stub = stub_of(leader)
    try:
        ack = (await stub.Publish(pb.PublishRequest(
            stream="guarded", value=b"both", ackPolicy=pb.AckPolicy.ALL), timeout=10)).ack
        assert ack.offset == 0
        await follower.stop()  # Raft keeps its majority: the leader asks it out of the ISR
        await until("the ISR shrinks to the leader", lambda: leader.broker.placement.of(
            "guarded", 0).isr == (placed.leader,))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Publish(pb.PublishRequest(
                stream="guarded", value=b"all", ackPolicy=pb.AckPolicy.ALL), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INTERNAL
        assert "ISR 1 < minIsr 2" in refused.value.details()
        ack = (await stub.Publish(pb.PublishRequest(
            stream="guarded", value=b"leader", ackPolicy=pb.AckPolicy.LEADER),
            timeout=10)).ack
        assert ack.offset == 1  # written (the "all" publish was not)
        partition = leader.broker.streams["guarded"].partitions[0]
        await asyncio.sleep(1)  # replication would have committed it by now, were it allowed
        assert (partition.next_offset, partition.committed_offset) == (2, 0)
    finally:
        await channel.close()


async def test_with_authorization_acks_reach_only_the_publishers_inboxes_across_routes(
        tmp_path):
    """Authorization on in a cluster: each embedded nats-server puts users in account USERS
    and its bridge in RIVERLOG, joined by routes. alice publishes on a follower's nats-server;
    the leader's NATS door learns she sent it (nats-server's Nats-Request-Info, added on the
    follower's server and carried over the route), stores it once and acks her own inbox;
    an envelope naming bob's inbox or riverlog's own ack inboxes is refused; the followers
    replicate it; the namespace stays out of her reach in USERS too."""
    passwords = {"alice": "alice-pw", "ops": "ops-pw"}
    security = SecurityConfig(
        users=tuple((name, hash_password(pw, rounds=4)) for name, pw in passwords.items()),
        authz=True, authz_rules=(("p", "alice", "orders", "publish"),
                                 ("p", "alice", "orders", "consume"), ("p", "ops", "*", "*")))
    apps = await started(tmp_path, security)
    errors: list[str] = []

    async def on_error(exc):
        errors.append(str(exc).lower())
    nc = None
    try:
        channel, stub = stub_of(apps[0])
        async with channel:
            await stub.CreateStream(pb.CreateStreamRequest(
                name="orders", subject="orders", replicationFactor=3), timeout=30,
                metadata=(("authorization", "Basic b3BzOm9wcy1wdw=="),))  # ops:ops-pw
        leader = await until("a leader", lambda: next((a for a in apps if "orders" in
                             a.broker.streams and a.broker.placement.leads("orders", 0)), None))
        follower = next(a for a in apps if a is not leader)
        await until("orders on the follower", lambda: "orders" in follower.broker.streams)
        await follower.nats.sync()  # alice's rights on its nats-server are in effect
        nc = await nats.connect(follower.nats.url, user="alice", password="alice-pw",
                                inbox_prefix="_INBOX.alice", error_cb=on_error)
        acks = await nc.subscribe(nc.new_inbox())
        await settle(nc)
        namespace = leader.liftbridge.namespace

        def envelope(inbox: str, correlation: str) -> bytes:
            return encode_publish(pb.Message(value=correlation.encode(), ackInbox=inbox,
                                             correlationId=correlation,
                                             ackPolicy=pb.AckPolicy.LEADER))
        for _ in range(600):  # the route and the leader's interest take a moment to form
            await nc.publish("orders", envelope(acks.subject, "mine"))
            try:
                ack = decode_ack((await acks.next_msg(timeout=0.1)).data)
                break
            except nats.errors.TimeoutError:
                continue
        # in order over one connection and route: the refused ones are never stored
        for inbox in ("_INBOX.bob.acks", f"{namespace}.ack.x"):  # not hers
            await nc.publish("orders", envelope(inbox, "forged"))
        await nc.publish("orders", envelope(acks.subject, "last"))
        while ack.correlationId == "mine":
            previous, ack = ack, decode_ack((await acks.next_msg(timeout=10)).data)
        assert (ack.stream, ack.correlationId, ack.offset) == ("orders", "last",
                                                               previous.offset + 1)
        assert leader.broker.streams["orders"].partitions[0].next_offset == ack.offset + 1
        # replication runs between the bridges, in RIVERLOG, under the namespace
        await until("the followers hold what the leader holds", lambda: all(
            a.broker.streams["orders"].partitions[0].committed_offset == ack.offset
            for a in apps))
        await nc.subscribe(f"{namespace}.>")
        await settle(nc)
        await until("the refusal", lambda: errors)
        assert len(errors) == 1 and "permissions violation for subscription" in errors[0]
    finally:
        if nc is not None:
            await nc.close()
        await stopped(apps)
