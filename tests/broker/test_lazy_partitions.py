"""Lazy partitions (issue 31 item 1, broker/partition.py): after a clean stop the broker opens
no partition and holds no file of one, answers offsets and sizes from the clean-close
markers, opens a cold partition on its first write or read; after a crash it checks only
the partitions written since their clean close; a clean start reads the streams' metadata
from the clean-stop marker."""
import asyncio
import json
import os

import pytest

from riverlog.broker import Broker
from riverlog.broker.clean_stop import CLEAN_STOP_FILE
from riverlog.broker.stream import METADATA_FILE, StreamConfig
from riverlog.broker.tracking import CLOSE_SNAPSHOT
from riverlog.errors import LogClosedError
from riverlog.log.chunk import encode_entries
from riverlog.log.clean_close import MARKER_NAME
from riverlog.log.files import OPEN_FILES

STREAMS = 300


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _filled(path) -> Broker:
    broker = Broker(str(path))
    broker.open()
    for i in range(STREAMS):
        broker.create(f"s{i}").partitions[0].write_records([b"hello %d" % i])
    return broker


def _reopened(path) -> Broker:
    broker = Broker(str(path))
    broker.open()
    return broker


def test_idle_streams_hold_no_file_and_answer_from_their_markers(tmp_path):
    asyncio.run(_filled(tmp_path).close())
    assert os.path.exists(tmp_path / "streams" / CLEAN_STOP_FILE)
    OPEN_FILES.close_under(str(tmp_path))
    before = _fds()
    broker = _reopened(tmp_path)
    assert not os.path.exists(tmp_path / "streams" / CLEAN_STOP_FILE)  # taken at the start
    assert len(broker.streams) == STREAMS
    partitions = [s.partitions[0] for s in broker.streams.values()]
    assert not any(p.is_open for p in partitions)
    # what listings, metrics and FetchMetadata ask, without opening
    assert {(p.first_offset, p.next_offset, p.committed_offset, p.last_message_offset)
            for p in partitions} == {(0, 1, 0, 0)}
    assert all(p.size_bytes > 0 and p.segment_count == 1 for p in partitions)
    assert not any(p.is_open for p in partitions)
    assert _fds() - before < 5  # not one per stream
    asyncio.run(broker.close())


def test_a_cold_partition_opens_on_its_first_write_or_read(tmp_path):
    asyncio.run(_filled(tmp_path).close())
    broker = _reopened(tmp_path)
    written, read = broker.get("s1").partitions[0], broker.get("s2").partitions[0]
    assert written.write_records([b"again"]) == range(1, 2)
    assert written.is_open and written.log.report.trusted  # no recovery scan
    chunks = read.read_chunks(0)
    assert read.is_open and [r for c in chunks for _, r in c.records()] == [b"hello 2"]
    assert sum(p.is_open for s in broker.streams.values() for p in s.partitions) == 2
    asyncio.run(broker.close())
    broker = _reopened(tmp_path)
    assert broker.get("s1").partitions[0].next_offset == 2  # from the new marker
    asyncio.run(broker.close())


def test_a_crash_checks_only_the_partitions_written_since_their_clean_close(tmp_path, caplog):
    asyncio.run(_filled(tmp_path).close())
    running = _reopened(tmp_path)
    for name in ("s3", "s4"):
        running.get(name).partitions[0].write_records([b"before the crash"])
    newest = running.get("s3").partitions[0].log.segments[-1].path
    # the process dies here: no close, no clean-stop marker; s3's tail is torn
    with open(newest, "ab") as f:
        f.write(b"\x00\x01torn")
    idle_marker = os.path.join(running.get("s0").partitions[0].directory, MARKER_NAME)
    idle_stat = os.stat(idle_marker).st_ino, os.stat(idle_marker).st_mtime_ns
    with caplog.at_level("INFO", logger="riverlog.broker"):
        broker = _reopened(tmp_path)
    assert "2 partition(s) written since their clean close checked" in caplog.text
    assert (os.stat(idle_marker).st_ino, os.stat(idle_marker).st_mtime_ns) == idle_stat
    assert not any(p.is_open for s in broker.streams.values() for p in s.partitions)
    for name in ("s3", "s4"):
        partition = broker.get(name).partitions[0]
        assert partition.next_offset == 2  # the checked partitions' markers were rewritten
        assert [r for c in partition.read_chunks(0) for _, r in c.records()] == [
            b"hello %d" % int(name[1:]), b"before the crash"]
        assert partition.log.report.trusted  # the check left it clean: no second scan
    asyncio.run(broker.close())


def test_an_unopened_partition_deleted_or_closed_never_opens(tmp_path):
    asyncio.run(_filled(tmp_path).close())
    broker = _reopened(tmp_path)
    stream = broker.get("s5")
    folder = stream.partitions[0].directory
    broker.delete("s5")
    assert not os.path.exists(folder)
    with pytest.raises(LogClosedError):
        stream.partitions[0].read_chunks(0)
    assert not os.path.exists(folder)  # not made again by the late reader
    asyncio.run(broker.close())


def test_a_clean_start_reads_the_metadata_from_the_clean_stop_marker(tmp_path):
    broker = _filled(tmp_path)
    folders = {name: broker.get(name).directory for name in ("s6", "s7")}
    asyncio.run(broker.close())
    # s6's metadata file garbled with its size and mtime kept: the marker's copy is taken
    path = os.path.join(folders["s6"], METADATA_FILE)
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(b"#" * st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    # s7's changed while stopped: the file is read
    path = os.path.join(folders["s7"], METADATA_FILE)
    with open(path) as f:
        data = json.load(f)
    data["config"]["subject"] = "changed"
    with open(path, "w") as f:
        json.dump(data, f)
    broker = _reopened(tmp_path)
    assert len(broker.streams) == STREAMS
    assert broker.get("s6").partitions[0].next_offset == 1
    assert broker.get("s7").config.subject == "changed"
    asyncio.run(broker.close())
    # without the marker (a crash) the garbled file cannot be read: that stream is skipped
    os.unlink(os.path.join(tmp_path, "streams", CLEAN_STOP_FILE))
    with open(os.path.join(folders["s6"], METADATA_FILE), "w") as f:
        f.write("#")
    broker = _reopened(tmp_path)
    assert "s6" not in broker.streams and len(broker.streams) == STREAMS - 1
    asyncio.run(broker.close())


def test_the_clean_stop_marker_keeps_set_partition_flags_and_leaves_out_unset_ones(tmp_path):
    """The marker is read at every clean start, so it holds no default: a stream whose
    partitions have no flag set has an empty partition_state there (and no config), while a
    paused or read-only partition's flags and their change times come back after the start."""
    broker = _filled(tmp_path)
    broker.create("flagged", StreamConfig(partitions=2))
    flagged = broker.get("flagged")
    flagged.partitions[1].paused = True
    flagged.partitions[1].events = {"pause": [1, 2]}
    flagged.partitions[0].readonly = True
    asyncio.run(broker.close())
    with open(os.path.join(tmp_path, "streams", CLEAN_STOP_FILE)) as f:
        entries = {e["metadata"]["name"]: e["metadata"] for e in json.load(f).values()}
    assert entries["s0"]["partition_state"] == [] and entries["s0"]["config"] == {}
    assert [p["paused"] for p in entries["flagged"]["partition_state"]] == [False, True]
    broker = _reopened(tmp_path)
    flagged = broker.get("flagged")
    assert [(p.paused, p.readonly) for p in flagged.partitions] == [(False, True),
                                                                   (True, False)]
    assert flagged.partitions[1].events == {"pause": [1, 2]}
    assert not broker.get("s0").partitions[0].paused
    asyncio.run(broker.close())


def test_a_cold_open_after_a_clean_close_takes_the_tracking_snapshot(tmp_path):
    broker = _reopened(tmp_path)
    partition = broker.create("tracked").partitions[0]
    for i in range(50):
        partition.write_entries([encode_entries([b"m%d" % i])], writers={"pub": i})
    partition.store_offset("reader", 20)
    asyncio.run(broker.close())
    snapshot = os.path.join(partition.directory, CLOSE_SNAPSHOT)
    with open(snapshot) as f:
        body = json.load(f)
    assert body == {"next_offset": 51, "sequences": {"pub": 49}, "offsets": {"reader": 20}}
    body["sequences"]["pub"] = 777  # what no scan of the log would find
    with open(snapshot, "w") as f:
        json.dump(body, f)
    broker = _reopened(tmp_path)
    partition = broker.get("tracked").partitions[0]
    assert partition.publishers.get("pub") == 777 and partition.offsets.query("reader") == 20
    assert not os.path.exists(snapshot)  # it serves one open only
    asyncio.run(broker.close())


def test_the_tracking_snapshot_is_not_taken_when_the_log_changed(tmp_path):
    broker = _reopened(tmp_path)
    partition = broker.create("tracked").partitions[0]
    partition.write_entries([encode_entries([b"m0"])], writers={"pub": 0})
    asyncio.run(broker.close())
    broker = _reopened(tmp_path)
    partition = broker.get("tracked").partitions[0]
    partition.log  # open (the snapshot is taken and removed), write, then "crash"
    partition.write_entries([encode_entries([b"m1"])], writers={"pub": 1})
    with open(os.path.join(partition.directory, CLOSE_SNAPSHOT), "w") as f:
        json.dump({"next_offset": 2, "sequences": {"pub": 0}, "offsets": {}}, f)  # stale
    broker = _reopened(tmp_path)  # after a crash: the folder is checked, not trusted
    assert broker.get("tracked").partitions[0].publishers.get("pub") == 1
    asyncio.run(broker.close())


def test_listings_after_a_clean_start_read_no_partition_marker(tmp_path):
    asyncio.run(_filled(tmp_path).close())
    os.unlink(tmp_path / "streams" / CLEAN_STOP_FILE)  # as after a crash: no summary known
    asyncio.run(_reopened(tmp_path).close())  # the stop reads each partition's marker once
    asyncio.run(_reopened(tmp_path).close())  # idle all along: the summaries carried over
    broker = _reopened(tmp_path)
    partitions = [s.partitions[0] for s in broker.streams.values()]
    for p in partitions:  # what a listing would read is already known
        os.unlink(os.path.join(p.directory, MARKER_NAME))
    assert {(p.first_offset, p.next_offset, p.committed_offset) for p in partitions} == {
        (0, 1, 0)}
    assert not any(p.is_open for p in partitions)
    asyncio.run(broker.close())


def test_a_clean_stop_marker_that_cannot_be_written_costs_only_a_check(tmp_path, caplog):
    broker = _filled(tmp_path)
    os.mkdir(tmp_path / "streams" / (CLEAN_STOP_FILE + ".tmp"))  # in the way of the write
    asyncio.run(broker.close())  # the stop still ends cleanly
    assert "no clean-stop marker written" in caplog.text
    with caplog.at_level("INFO", logger="riverlog.broker"):
        broker = _reopened(tmp_path)
    assert "0 partition(s) written since their clean close checked" in caplog.text
    assert len(broker.streams) == STREAMS
    asyncio.run(broker.close())
