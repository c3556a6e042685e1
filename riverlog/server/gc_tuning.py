# The garbage collector's settings for a running server. Owns when and how `riverlog serve`
# changes them (the only other user of the gc module is Broker.open, which pauses the
# collector while it loads the streams).
# Rules: the thresholds are raised before start-up (a start with 10,000 streams otherwise
# sets off full collections of its streams: 40 ms of its start), what start-up made is
# frozen out of every collection after it (gc.freeze); the young generation is collected
# after GEN0_THRESHOLD new container objects instead of CPython's 700, so the per-message
# tuples, lists and protobuf wrappers of a busy door do not set off a collection every few
# hundred messages (measured in benchmarks/README.md, "Garbage collector": 15-20% of the
# server's CPU on lift-bench). Cyclic garbage is still collected; it lives a little longer
# (at most GEN0_THRESHOLD objects before the young generation is swept).
from __future__ import annotations

import gc
import logging

log = logging.getLogger("riverlog")

GEN0_THRESHOLD = 100_000
GEN1_THRESHOLD = 50
GEN2_THRESHOLD = 100


def tune() -> None:
    """Raise the collection thresholds (see above); before start-up."""
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)


def freeze() -> None:
    """Freeze what start-up allocated out of every later collection; after start-up."""
    gc.freeze()
    log.debug("gc: %d start-up objects frozen, thresholds %s", gc.get_freeze_count(),
              gc.get_threshold())
