# The test harness's port picker (compat/_servers.free_port): the ports it hands out in one
# process are distinct, so the servers of one test never share one (a cluster's Raft ports).
from __future__ import annotations

from compat._servers import free_port


def test_free_port_never_hands_out_a_port_twice():
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
