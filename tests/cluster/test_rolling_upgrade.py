# A rolling upgrade at a small scale (issue 31 item 3; benchmarks/rolling_upgrade.py holds the
# harness and the longer run): three `riverlog serve` processes of an earlier riverlog
# (rolling_upgrade.OLDER_COMMIT, installed by the harness into a venv of its own, cached in the
# temp folder or RIVERLOG_UPGRADE_CACHE; building it needs PyPI's build tools once) are
# upgraded one at a time to this checkout while rstream (confirms), nats-py (enveloped, ALL
# acks) and gufo-liftbridge (PublishAsync, ALL acks) publish. Every acknowledged message must
# be stored exactly once, no message twice, no client refused (reconnects allowed), and a super
# stream made through the upgraded server while the others are older must reach them all, and
# PublishAsync through it to an older leader must be acked (both fallbacks of the feature table).
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import rolling_upgrade  # noqa: E402  benchmarks/rolling_upgrade.py


# a hang guard, not a target: building the older venv takes 1-3 minutes the first time; the
# run itself ~60-120 s (three restarts of a Python server, each back in the ISR)
@pytest.mark.timeout(900)
async def test_a_rolling_upgrade_under_load_loses_nothing_acknowledged(tmp_path):
    lines: list[str] = []
    report = await rolling_upgrade.run_upgrade(str(tmp_path), steady_s=3.0, after_s=2.0,
                                               rate=300, log=lines.append)
    detail = "\n".join(lines[-30:]) + "\n" + report.as_json()
    print(detail)
    assert not report.problems, detail
    assert all(report.acked[name] > 0 for name in rolling_upgrade.PUBLISHERS), detail
    assert len(report.restart_s) == 3, detail
