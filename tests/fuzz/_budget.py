# The fuzz budget shared by tests/fuzz: hypothesis settings sized so that each target runs a few
# seconds in CI. benchmarks/fuzz_bench.py runs the same tests for longer by setting
# RIVERLOG_FUZZ_EXAMPLES (examples per test) and a fresh --hypothesis-seed per pass.
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_OVERRIDE = int(os.environ.get("RIVERLOG_FUZZ_EXAMPLES", "0"))


def budget(examples: int, share: float = 1.0) -> settings:
    """Settings for one fuzz test: ``examples`` in CI, RIVERLOG_FUZZ_EXAMPLES x ``share`` when
    set (slow targets take a share); no deadline (the shared machine stalls now and then), no
    example database (runs are independent, a failure prints its reproducer)."""
    wanted = max(1, int(_OVERRIDE * share)) if _OVERRIDE else examples
    return settings(max_examples=wanted, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])
