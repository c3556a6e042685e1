# The fuzz tests of tests/fuzz (RabbitMQ Stream frames, Liftbridge envelopes, gRPC requests
# into a live App, configuration files) for a wall-clock budget instead of CI's few seconds:
# pytest passes one after the other, each with a fresh --hypothesis-seed and
# RIVERLOG_FUZZ_EXAMPLES examples per test, until --seconds have gone by. The first failing pass
# stops the run and prints the seed that replays it.
#
# Run: .venv/bin/python benchmarks/fuzz_bench.py [--seconds 600] [--examples 5000] [-k grpc]
#      (results: benchmarks/README.md)
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description="Run tests/fuzz for a time budget.")
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--examples", type=int, default=5000,
                        help="hypothesis examples per test and pass (the slower gRPC tests run a share of it)")
    parser.add_argument("-k", default=None, help="pytest -k expression (one target)")
    args = parser.parse_args()
    began = time.monotonic()
    passes = 0
    while time.monotonic() - began < args.seconds:
        seed = random.randrange(1 << 32)
        cmd = [sys.executable, "-m", "pytest", "tests/fuzz", "-x", "-q", "-p", "no:cacheprovider",
               f"--hypothesis-seed={seed}", "--timeout=0"] + (["-k", args.k] if args.k else [])
        env = {**os.environ, "RIVERLOG_FUZZ_EXAMPLES": str(args.examples)}
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-20000:], done.stderr[-5000:], sep="\n")
            print(f"FAILED on pass {passes + 1}: replay with RIVERLOG_FUZZ_EXAMPLES="
                  f"{args.examples} {' '.join(cmd[1:])}")
            sys.exit(1)
        passes += 1
        print(f"pass {passes} (seed {seed}): {done.stdout.strip().splitlines()[-1]}", flush=True)
    print(json.dumps({"passes": passes, "examples_per_test": args.examples,
                      "seconds": round(time.monotonic() - began), "failures": 0}))


if __name__ == "__main__":
    main()
