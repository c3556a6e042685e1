# Fixtures of the security tests: the users (bcrypt hashes of _sec.PASSWORDS) and test
# certificates made in tmp_path with `cryptography` (_certs.py). Helpers are in _sec.py.
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _certs import Authority  # noqa: E402
from _sec import PASSWORDS, Pki  # noqa: E402
from riverlog.security.users import hash_password  # noqa: E402


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
