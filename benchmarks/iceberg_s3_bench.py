# The cost of one Iceberg writer pass on object storage against a local folder, side by side
# in one run (issue 23, "object storage through pyarrow filesystems"): two tables made as the
# writer makes them (riverlog.tables.iceberg.create_table, catalog a SQLite file on local
# disk), one in a local folder, one in a bucket of an S3 endpoint moto serves in this process
# (the real S3 protocol over loopback, no network latency: a lower bound of what a remote
# bucket costs in requests, not in round trips); --passes passes, alternating the two, each
# writing one small data file (--rows records) with pyiceberg and committing it with
# riverlog.tables.iceberg_commit.commit (what a writer pass does: data file, manifest,
# manifest list, metadata JSON, the catalog row). Prints the median and max pass time of the
# first and the last tenth of the passes, per table.
#
#   .venv/bin/python benchmarks/iceberg_s3_bench.py --passes 200 --rows 300
from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--passes", type=int, default=200)
    ap.add_argument("--rows", type=int, default=300)
    args = ap.parse_args()

    import logging

    import pyarrow as pa
    from moto.server import ThreadedMotoServer
    from pyarrow import fs
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    from riverlog.spark.arrow import arrow_schema
    from riverlog.tables import iceberg as ice
    from riverlog.tables import iceberg_commit as shared

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    fs.S3FileSystem(access_key="k", secret_key="s", region="us-east-1", scheme="http",
                    endpoint_override=f"{host}:{port}",
                    allow_bucket_creation=True).create_dir("bench")
    work = tempfile.mkdtemp(prefix="iceberg-s3-bench-")
    places = {"local": f"{work}/tables",
              "s3 (moto)": (f"s3://k:s@bench/tables?region=us-east-1&scheme=http"
                            f"&endpoint_override={host}:{port}")}
    tables = {}
    for name, table_dir in places.items():
        catalog = ice.load_catalog(table_dir, f"sqlite:///{work}/{name[:5]}.db")
        tables[name] = ice.create_table(catalog, table_dir, "bench", 1)
    schema = arrow_schema()
    times: dict[str, list[float]] = {name: [] for name in places}
    offset = 0
    for i in range(args.passes):
        n = args.rows
        rows = pa.table({
            "key": [b"k%d" % (j % 1000) for j in range(n)], "value": [b"x" * 100] * n,
            "stream": ["bench"] * n, "partition": [0] * n,
            "offset": list(range(offset, offset + n)),
            "timestamp": [1_700_000_000_000_000 + j for j in range(n)],
            "headers": [[] for _ in range(n)]}, schema=schema)
        offset += n
        for name in (places if i % 2 else reversed(list(places))):
            table = tables[name]
            started = time.perf_counter()
            files = list(_dataframe_to_data_files(table_metadata=table.metadata, df=rows,
                                                  io=table.io))
            snapshot = table.current_snapshot()
            tables[name] = shared.commit(table, "bench", snapshot, {0: 1},
                                         {0: (0, offset)}, {}, [], files)[0]
            times[name].append(time.perf_counter() - started)
    tenth = max(args.passes // 10, 1)
    for name, ts in times.items():
        first, last = ts[:tenth], ts[-tenth:]
        print(f"{name:10} first {tenth}: median {statistics.median(first) * 1000:.0f} ms, "
              f"max {max(first) * 1000:.0f} ms; last {tenth}: median "
              f"{statistics.median(last) * 1000:.0f} ms, max {max(last) * 1000:.0f} ms")
    server.stop()


if __name__ == "__main__":
    main()
