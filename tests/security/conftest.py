# Fixtures of the security tests: the users (bcrypt hashes of _sec.PASSWORDS) and test
# certificates made in tmp_path with `cryptography` (_certs.py), and a non-loopback address of
# this machine for tests of remote clients. Helpers are in _sec.py.
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _certs import Authority  # noqa: E402
from _sec import PASSWORDS, Pki  # noqa: E402
from riverlog.security.users import hash_password, is_loopback  # noqa: E402


@pytest.fixture(scope="session")
def users():
    return tuple((name, hash_password(pw, rounds=4)) for name, pw in PASSWORDS.items())


@pytest.fixture
def pki(tmp_path) -> Pki:
    ca = Authority(str(tmp_path))
    (tmp_path / "other").mkdir()
    other = Authority(str(tmp_path / "other"), "stranger CA")
    return Pki(ca.pem, ca.issue("localhost", server=True), ca.issue("alice"), ca.issue("dave"),
               ca.issue("carol"), other.issue("alice"))


@pytest.fixture(scope="session")
def remote_host():
    """An IPv4 address of this machine that is not loopback: a client that connects to it is
    a remote client to a server bound to 0.0.0.0 (its source address is that address too).
    The address of the default route's interface; without one, 198.18.0.1 added to `lo`
    (`ip addr add`, as root) for the session."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("198.51.100.1", 9))  # no packet is sent: this only picks a route
        address = probe.getsockname()[0]
    except OSError:
        address = None
    finally:
        probe.close()
    if address is not None and not is_loopback(address):
        yield address
        return
    address = "198.18.0.1"
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    try:
        yield address
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False)
