# Opening the embedded SQLite catalog from several processes at once (a cluster's servers
# sharing DIR/tables, a reader beside the table worker): every one gets the catalog.
from __future__ import annotations

import importlib
import multiprocessing


def _open(table_dir: str, barrier, answers) -> None:
    from riverlog.tables import iceberg as ice
    barrier.wait()
    try:
        ice.load_catalog(table_dir)
        answers.put("opened")
    except ice.CatalogError as exc:
        answers.put(str(exc))


def test_processes_opening_a_new_catalog_at_once_all_get_it(tmp_path):
    """pyiceberg creates a new catalog's tables after checking they are missing: four
    processes at once failed with "table iceberg_tables already exists" (31 of 80 openings
    here before), which stopped a table worker's pass."""
    for module in ("riverlog.tables.iceberg", "pyiceberg.catalog.sql"):
        importlib.import_module(module)  # before the fork, as a server has them

    ctx = multiprocessing.get_context("fork")
    answers = ctx.Queue()
    for round_ in range(10):
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_open, args=(str(tmp_path / str(round_)), barrier,
                                                 answers)) for _ in range(4)]
        for p in procs:
            p.start()
        got = [answers.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
        assert got == ["opened"] * 4, got
