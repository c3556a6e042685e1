"""Policies in a cluster: not agreed through Raft yet, so every change is refused with 503
and a message that says so (riverlog.server.runtime_policies.CLUSTER_REFUSAL) rather than
servers that disagree; the listings are empty and the queues show no policy."""
from __future__ import annotations

from _apps import started, stopped
from server.test_management import call


async def test_policy_changes_are_refused_in_a_cluster(tmp_path):
    cluster = await started(tmp_path)
    try:
        a, b, _ = cluster
        status, answer = await call(a, "PUT", "/api/policies/%2F/p",
                                    json={"pattern": ".*", "definition": {"max-age": "1D"}})
        assert status == 503 and answer["error"] == "service_unavailable"
        assert "not available in a cluster" in answer["reason"]
        status, answer = await call(b, "DELETE", "/api/policies/%2F/p")
        assert status == 503 and "not available in a cluster" in answer["reason"]
        # validation still comes first: a bad body is 400 there too
        assert (await call(a, "PUT", "/api/policies/%2F/p",
                           json={"pattern": "(", "definition": {"max-age": "1D"}}))[0] == 400
        assert (await call(b, "GET", "/api/policies")) == (200, [])
    finally:
        await stopped(cluster)
