"""The pieces of replication that need no server: subject tokens, settings checks, the
high-watermark checkpoint file, what truncation and reset do to writes waiting for their
commit."""
import pytest

from riverlog.broker.appender import Appender
from riverlog.broker.partition import Partition
from riverlog.cluster.replication import ReplicationSettings
from riverlog.cluster.replication_subjects import notify_subject, partition_subject, subject_token
from riverlog.config import LogConfig
from riverlog.errors import UncommittedTruncatedError
from riverlog.log.high_watermark import CHECKPOINT_NAME, HighWatermarkCheckpoint
from riverlog.protocol.nats_subject import subject_problem
from riverlog.record import Record, encode_record

NAMES = ["orders", "a.b", "a%2Eb", "*", ">", "with space", "tab\there", "ü", "%", "a-b_c",
         "x" * 255, ".", "..", "%25"]


def test_every_stream_name_is_one_token_and_no_two_names_share_one():
    tokens = [subject_token(n) for n in NAMES]
    assert len(set(tokens)) == len(NAMES)
    for name in NAMES:
        subject = partition_subject("ns", name, 3, "replicate")
        assert subject_problem(subject) is None, name
        assert subject.split(".")[1] == subject_token(name) and len(subject.split(".")) == 4
    assert subject_token("orders") == "orders" and subject_token("a.b") == "a%2Eb"
    assert notify_subject("ns", "server 1") == "ns.notify.server%201"


def test_settings_refuse_an_idle_wait_a_dead_peer_could_hide_behind():
    ReplicationSettings()
    with pytest.raises(ValueError, match="idle.wait"):
        ReplicationSettings(replica_max_idle_wait_ms=2000, replica_max_leader_timeout_ms=1500)
    with pytest.raises(ValueError, match="replica_fetch_timeout_ms"):
        ReplicationSettings(replica_fetch_timeout_ms=0)


def test_the_checkpoint_round_trips_and_a_damaged_one_reads_as_nothing_committed(tmp_path):
    cp = HighWatermarkCheckpoint(tmp_path)
    assert cp.offset == -1 and cp.problem is None
    cp.write(41)
    assert HighWatermarkCheckpoint(tmp_path).offset == 41
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"4x\n")
    damaged = HighWatermarkCheckpoint(tmp_path)
    assert damaged.offset == -1 and "not a high watermark" in damaged.problem
    cp.write(-1)
    assert not (tmp_path / CHECKPOINT_NAME).exists()


class Acks:
    """A door's view of its records through the Appender (the Sink protocol)."""

    def __init__(self) -> None:
        self.outcomes: list = []

    def written(self, offset: int) -> None:
        pass

    def committed(self, offset: int) -> None:
        self.outcomes.append(("committed", offset))

    def failed(self, error: BaseException) -> None:
        self.outcomes.append(("failed", error))


def records(what: bytes) -> list[bytes]:
    return [encode_record(Record(value=b"%s %d" % (what, i))) for i in range(3)]


def truncated_and_overwritten(part: Partition) -> None:
    # a deposed leader appended records its followers never got; as a follower of the new
    # leader it truncates them, and the new leader's records later commit at those offsets
    # (benchmarks/cluster_bench.py found 38,205 ALL acks given for such lost records)
    part.truncate(0)
    part.write_records(records(b"new leader's"))
    part.log.commit(2)


def reset_to_the_leaders_start(part: Partition) -> None:
    # a follower whose log ends before its leader's start (retention there) starts again
    # from the leader's start (the writes waited for ever before)
    part.log.reset(10)


@pytest.mark.parametrize("remove", [truncated_and_overwritten, reset_to_the_leaders_start])
async def test_a_write_removed_before_its_commit_fails_and_is_never_acknowledged(tmp_path,
                                                                                 remove):
    part = Partition("s", 0, str(tmp_path), LogConfig(), auto_commit=False)
    appender = Appender(part)
    mine = Acks()
    appender.extend(records(b"deposed leader's"), mine)
    await appender.drain(timeout=0)
    remove(part)
    await appender.drain()
    assert [o for o, _ in mine.outcomes] == ["failed"] * 3, mine.outcomes
    assert all(isinstance(e, UncommittedTruncatedError) for _, e in mine.outcomes)
    await part.close()
