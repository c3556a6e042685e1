# Streams as Iceberg tables in a cluster (issue 23): what a commit costs when several
# partition leaders commit to one table at once. W writer processes (one per partition, as
# W leaders on W servers) each make C passes: write one small data file of its partition
# (pyiceberg) and commit it with riverlog.tables.iceberg_commit.commit (retried on
# conflict, summary merged), as fast as they can. Printed per catalog and W: commits per
# second over all writers, a commit's median and p95 time (retries included), conflicts
# retried per commit, and passes whose commit still conflicted after COMMIT_TRIES (the
# writer's pass fails then and the next one plans again; not counted in the times). Catalogs: the SQLite file `riverlog cluster up` shares, and a
# throwaway PostgreSQL server (tests/cluster/_postgres.py; skipped when not installed).
#
#   .venv/bin/python benchmarks/iceberg_cluster_bench.py --passes 40 --writers 1 3
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..", "tests", "cluster")]

STREAM = "bench"


def writer(table_dir: str, catalog: str | None, partition: int, passes: int, start, out):
    try:
        out.put(_writer(table_dir, catalog, partition, passes, start, out))
    except Exception as exc:
        out.put(f"writer {partition}: {type(exc).__name__}: {exc}")


def _writer(table_dir: str, catalog: str | None, partition: int, passes: int, start, out):
    import pyarrow as pa

    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    from riverlog.spark.arrow import arrow_schema
    from riverlog.tables import iceberg as ice
    from riverlog.tables import iceberg_commit as shared

    from pyiceberg.exceptions import CommitFailedException

    schema = arrow_schema()
    cat = ice.load_catalog(table_dir, catalog)
    ice.load_table(cat, STREAM)
    out.put("ready")
    start.wait()
    times, retries, end, gave_up = [], 0, 0, 0
    for _ in range(passes):
        rows = pa.Table.from_pylist([{
            "key": b"k%d" % i, "value": b"v" * 100, "stream": STREAM, "partition": partition,
            "offset": end + i, "timestamp": 1_700_000_000_000_000 + i, "headers": []}
            for i in range(100)], schema)
        began = time.perf_counter()
        table = ice.load_table(cat, STREAM)
        base = table.current_snapshot()
        added = list(_dataframe_to_data_files(table_metadata=table.metadata, df=rows,
                                              io=table.io))
        offsets = ice.snapshot_offsets(base)
        offsets[partition] = (0, end + 100)
        try:
            _, tried = shared.commit(table, STREAM, base, {partition: 1}, offsets, {}, [],
                                     added)
        except CommitFailedException:  # the writer's pass fails; the next plans again
            gave_up += 1
            retries += shared.COMMIT_TRIES - 1
            continue
        times.append(time.perf_counter() - began)
        retries += tried
        end += 100
    return times, retries, gave_up


def run(table_dir: str, catalog: str | None, writers: int, passes: int) -> dict:
    from riverlog.tables import iceberg as ice

    cat = ice.load_catalog(table_dir, catalog)
    if ice.load_table(cat, STREAM) is not None:
        cat.drop_table(ice.identifier(STREAM))
    ice.create_table(cat, table_dir, STREAM, 1)
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=writer, args=(table_dir, catalog, p, passes, start, out))
             for p in range(writers)]
    for p in procs:
        p.start()
    ready = [out.get(timeout=120) for _ in procs]  # pyiceberg imported, the catalog open
    assert ready == ["ready"] * writers, ready
    began = time.perf_counter()
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    failed = [r for r in results if isinstance(r, str)]
    assert not failed, failed
    elapsed = time.perf_counter() - began
    for p in procs:
        p.join()
    times = sorted(t for r in results for t in r[0])
    held = ice.snapshot_offsets(ice.load_table(cat, STREAM).current_snapshot())
    done = [len(r[0]) for r in results]  # a writer's results are in its partition's order
    assert sorted(e for _, e in held.values()) == sorted(n * 100 for n in done), held
    return {"commits/s": len(times) / elapsed, "median ms": statistics.median(times) * 1000,
            "p95 ms": times[int(len(times) * 0.95) - 1] * 1000,
            "retries/commit": sum(r[1] for r in results) / len(times),
            "passes given up": sum(r[2] for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=40)
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 3])
    args = parser.parse_args()
    from _postgres import missing, postgres
    with tempfile.TemporaryDirectory() as folder:
        catalogs = [("sqlite (shared file)", None)]
        with postgres() if not missing() else _none() as url:
            if url:
                catalogs.append(("postgresql 15 (loopback)", url))
            for name, catalog in catalogs:
                for w in args.writers:
                    result = run(os.path.join(folder, name.split()[0]), catalog, w,
                                 args.passes)
                    print(f"{name:26s} writers {w}: " + ", ".join(
                        f"{k} {v:.2f}" for k, v in result.items()), flush=True)


class _none:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
