# The planning of replica moves (riverlog.cluster.reassign), without servers: which
# partitions a request names and where a removed server's replicas go (balanced), on the
# metadata summary `admin_at(..., "state")` returns.
from __future__ import annotations

import pytest

from riverlog.cluster import state as s
from riverlog.cluster.state_super import create_super_stream
from riverlog.cluster.metadata import summary
from riverlog.cluster.reassign import partitions_of, plan_moves, server_with_raft_address


def _state(servers, *streams):
    state = s.ClusterState()
    for server in servers:
        state, _ = s.add_server(state, s.Server(server, {"raft": s.Door("h", ord(server))}))
    for name, partitions, factor in streams:
        state, _ = s.create_stream(state, name, name, partitions, factor)
    return state


def test_moves_spread_over_the_servers_holding_fewest_replicas():
    state = _state("abc", ("x", 4, 2))  # x/0 a b, x/1 b c, x/2 c a, x/3 a b
    state, _ = s.add_server(state, s.Server("d", {}))
    state, _ = s.add_server(state, s.Server("e", {}))
    moves = plan_moves(summary(state), "a")
    assert moves == [("x", 0, "d"), ("x", 2, "e"), ("x", 3, "d")]
    loads = {}
    for _, _, target in moves:
        loads[target] = loads.get(target, 0) + 1
    assert max(loads.values()) - min(loads.values()) <= 1


def test_a_partition_on_every_server_only_loses_its_replica():
    state = _state("abc", ("one", 1, 1), ("all", 1, s.ALL_SERVERS))
    assert plan_moves(summary(state), "a") == [("all", 0, None), ("one", 0, "b")]
    assert plan_moves(summary(state), "zz") == []


def test_a_request_names_partitions_and_servers_or_says_what_is_unknown():
    state = summary(_state("ab", ("x", 3, 1)))
    assert partitions_of(state, "x") == [0, 1, 2]
    assert partitions_of(state, "x", (2,)) == [2]
    with pytest.raises(s.MetadataError, match="no stream 'y'"):
        partitions_of(state, "y")
    with pytest.raises(s.MetadataError, match="has no partition 3 \\(it has 3\\)"):
        partitions_of(state, "x", (3,))
    assert server_with_raft_address(state, f"h:{ord('b')}") == "b"
    with pytest.raises(s.MetadataError, match="no registered server has the Raft address"):
        server_with_raft_address(state, "h:1")


def test_a_super_stream_named_as_a_stream_gets_its_partitions_named():
    state, _ = s.create_stream(_state("ab"), "invoices-0", "invoices-0")
    state, _ = create_super_stream(state, "invoices", ("invoices-0",), ("0",))
    with pytest.raises(s.MetadataError, match="'invoices' is a super stream, name its "
                                              "partition streams \\(invoices-0\\)"):
        partitions_of(summary(state), "invoices")
    assert partitions_of(summary(state), "invoices-0") == [0]
