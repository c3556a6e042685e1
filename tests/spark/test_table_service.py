# When the table service (riverlog.tables.service) starts a writer pass, against a real broker
# with a real partition log (the service not started: its clock is given, so nothing here
# depends on how fast the machine is): a third of streams.table.lag after the last pass
# started; half that when a partition's table is behind and its committed offset stood still
# for QUIET_S (the tail of a burst), once per committed offset; never sooner.
from __future__ import annotations

from riverlog.broker import Broker
from riverlog.config import TableConfig
from riverlog.tables.service import QUIET_S, TableService, TableStatus


def test_a_pass_starts_on_the_tick_or_when_a_behind_partition_stood_still(tmp_path):
    broker = Broker(str(tmp_path / "data"))
    broker.open()
    p = broker.create("s").partitions[0]
    service = TableService(broker, TableConfig(enabled=True, lag_ms=6000),
                           str(tmp_path / "tables"))
    interval = 2.0  # a third of the lag
    assert service._due(100.0)  # the first look: a pass at once
    p.log.append([b"a", b"b"])
    committed = p.committed_offset
    assert committed == 1
    assert not service._due(100.1)  # it just moved
    assert not service._due(100.1 + QUIET_S)  # still: but too soon after the last pass
    assert service._due(100.0 + interval / 2)  # still and behind: the tail is written
    assert not service._due(100.0 + interval * 0.9)  # once per committed offset
    assert service._due(101.0 + interval)  # the tick, a third of the lag after the last
    # the table holds it all: standing still is no reason for a pass
    service.status[("s", 0)] = TableStatus(first=0, end=committed + 1)
    assert not service._due(103.0 + interval / 2)
    # more records, then still: the tail again; a failing table waits for the tick
    p.log.append([b"c"])
    assert not service._due(104.0)
    assert service._due(104.0 + QUIET_S)
    p.log.append([b"d"])
    service.status[("s", 0)].error = "the catalog cannot be reached"
    assert not service._due(105.1)
    assert not service._due(105.1 + QUIET_S)
    assert service._due(104.0 + QUIET_S + interval)
