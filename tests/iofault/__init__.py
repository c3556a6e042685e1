# The LD_PRELOAD storage fault shim of the tests (iofault.c: EIO from fsync, write or read on
# the files whose path holds a given text, armed by files in RIVERLOG_FAULT_DIR): building it
# and arming it. Used by tests/log/test_storage_faults.py and tests/cluster.
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

SOURCE = os.path.join(os.path.dirname(__file__), "iofault.c")


def build(out_dir: str) -> str:
    """Compile the shim into ``out_dir``; returns the .so path (fails the test without cc)."""
    if shutil.which("cc") is None:
        pytest.fail("the storage fault tests build an LD_PRELOAD shim: install a C compiler")
    out = os.path.join(out_dir, "iofault.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", out, SOURCE, "-ldl"], check=True)
    return out


def arm(fault_dir: str, what: str, match: str) -> None:
    """Make ``what`` ("fsync", "write", "read") fail with EIO on paths containing ``match``."""
    with open(os.path.join(fault_dir, "match"), "w") as f:
        f.write(match)
    open(os.path.join(fault_dir, what), "w").close()


def disarm(fault_dir: str, what: str) -> None:
    os.unlink(os.path.join(fault_dir, what))
