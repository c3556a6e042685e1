# Users (bcrypt hashes only, the loopback rule), the casbin authorizer (deny by default, stream
# patterns, roles), the configuration keys that set them, and `riverlog user hash`.
from __future__ import annotations

import os
import subprocess
import sys

import bcrypt
import pytest

from riverlog.config import SecurityConfig
from riverlog.config_file import ConfigError, build, load
from riverlog.security.authz import Authorizer, read_policy_file
from riverlog.security.guard import Guard
from riverlog.security.nats_auth import own_inboxes
from riverlog.security.users import GUEST_HASH, Users, hash_password

RIVERLOG = [sys.executable, "-m", "riverlog"]


def test_hashes_only_and_password_checks():
    hashed = hash_password("s3cret", rounds=4)
    assert hashed.startswith("$2b$04$") and "s3cret" not in hashed
    users = Users([("alice", hashed), ("dave", "")])
    assert users.check_password("alice", "s3cret")
    assert users.check_password("alice", "s3cret")  # remembered: same answer
    assert not users.check_password("alice", "S3cret")
    assert not users.check_password("dave", "")  # certificate-only user
    assert not users.check_password("nobody", "s3cret")
    with pytest.raises(ValueError, match="bcrypt hash"):
        Users([("eve", "plain-password")])
    with pytest.raises(ValueError, match="72 bytes"):
        hash_password("x" * 73, rounds=4)


def test_guest_is_the_default_user_from_loopback_only():
    guard = Guard(SecurityConfig())
    assert bcrypt.checkpw(b"guest", GUEST_HASH.encode())
    assert guard.login("guest", "guest", "127.0.0.1") is None
    assert guard.login("guest", "guest", "::1") is None
    assert guard.login("guest", "guest", "10.1.2.3") == "loopback"
    assert guard.login("guest", "wrong", "127.0.0.1") == "password"


def test_authorization_denies_by_default_and_matches_patterns():
    off = Authorizer(enabled=False)
    assert off.allowed(None, "anything", "delete")
    authz = Authorizer(True, [("p", "alice", "orders.*", "publish"),
                              ("p", "admin", "*", "*"), ("g", "ops", "admin")])
    assert authz.allowed("alice", "orders.eu", "publish")
    assert not authz.allowed("alice", "orders.eu", "consume")
    assert not authz.allowed("alice", "logs", "publish")
    assert not authz.allowed("bob", "orders.eu", "publish")  # no line: denied
    assert not authz.allowed(None, "orders.eu", "publish")
    assert authz.allowed("ops", "logs", "delete") and authz.allowed("ops", "x", "admin")
    with pytest.raises(ValueError, match="unknown action"):
        Authorizer(True, [("p", "alice", "*", "write")])


def test_policy_and_model_files(tmp_path):
    policy = tmp_path / "policy.csv"
    policy.write_text("# who may do what\np, alice, orders.*, publish\n\ng, ops, admin\n"
                      "p, admin, *, *\n")
    rules = read_policy_file(str(policy))
    assert rules == [("p", "alice", "orders.*", "publish"), ("g", "ops", "admin"),
                     ("p", "admin", "*", "*")]
    policy.write_text("p, alice, orders.*\n")
    with pytest.raises(ValueError, match="policy.csv:1"):
        read_policy_file(str(policy))
    # a model of one's own: exact stream names instead of patterns
    model = tmp_path / "model.conf"
    model.write_text("[request_definition]\nr = sub, obj, act\n[policy_definition]\n"
                     "p = sub, obj, act\n[policy_effect]\ne = some(where (p.eft == allow))\n"
                     "[matchers]\nm = r.sub == p.sub && r.obj == p.obj && r.act == p.act\n")
    authz = Authorizer(True, [("p", "alice", "orders.*", "publish")], str(model))
    assert authz.allowed("alice", "orders.*", "publish")
    assert not authz.allowed("alice", "orders.eu", "publish")


def test_configuration_keys(tmp_path):
    hashed = hash_password("pw", rounds=4)
    policy = tmp_path / "policy.csv"
    policy.write_text("p, bob, *, consume\n")
    cfg = tmp_path / "riverlog.yaml"
    cfg.write_text(f"""
tls:
  cert: /certs/server.pem
  key: /certs/server.key
  client.auth:
    enabled: true
    ca: /certs/ca.pem
  client.authz:
    enabled: true
    policy: {policy}
nats:
  servers: [nats://n1:4222]
  user: riverlog
  password: nats-pw
  tls.ca: /certs/nats-ca.pem
riverlog:
  users:
    alice: "{hashed}"
    dave:
  loopback.users: []
  authz.rules:
    - [alice, "orders.*", publish]
    - [g, carol, admin]
  stream.tls.port: 15551
""")
    config, _ = build(load(str(cfg), {}), {})
    sec = config.security
    assert sec.users == (("alice", hashed), ("dave", "")) and sec.loopback_users == ()
    assert (sec.tls.cert, sec.tls.key, sec.tls.ca, sec.tls.client_auth) == (
        "/certs/server.pem", "/certs/server.key", "/certs/ca.pem", True)
    assert sec.authz and sec.authz_rules == (("p", "alice", "orders.*", "publish"),
                                             ("g", "carol", "admin"), ("p", "bob", "*", "consume"))
    assert config.rabbitmq_stream.tls_port == 15551
    nats_config = config.nats
    assert (nats_config.user, nats_config.password, nats_config.tls_ca) == (
        "riverlog", "nats-pw", "/certs/nats-ca.pem")
    # the flags
    config, _ = build(load(None, {}), {"tls_cert": "c.pem", "tls_key": "k.pem",
                                       "tls_ca": "ca.pem", "tls_client_auth": True,
                                       "stream_tls_port": 0})
    assert config.security.tls.client_auth and config.rabbitmq_stream.tls_port == 0
    # defaults: guest from loopback, no TLS, no authorization
    config, _ = build(load(None, {}), {})
    assert config.security == SecurityConfig()
    for text, message in (("tls.client.auth.enabled: true\n", "needs tls.cert"),
                          ("tls: {cert: c, key: k, client.auth.enabled: true}\n",
                           "needs tls.client.auth.ca"),
                          ("riverlog.users: [alice]\n", "riverlog.users: expected a map"),
                          ("riverlog.authz.rules: true\n", "riverlog.authz.rules: expected a list"),
                          ("riverlog.authz.rules: {alice: x}\n",
                           "riverlog.authz.rules: expected a list")):
        cfg.write_text(text)
        with pytest.raises(ConfigError, match=message):
            build(load(str(cfg), {}), {})


def test_riverlog_user_hash_command():
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run(RIVERLOG + ["user", "hash", "--rounds", "4"], input="pa ss\n",
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert bcrypt.checkpw(b"pa ss", out.stdout.strip().encode())
    out = subprocess.run(RIVERLOG + ["user", "hash", "--rounds", "3", "--password", "x"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0 and "Traceback" not in out.stderr


def test_own_inboxes_are_one_token_under_inbox():
    """A user's ack inboxes are `_INBOX.<user>.>`; a name that is not one subject token has
    none (`alice`'s would otherwise cover `alice.smith`'s, and `*`/`>` everyone's)."""
    assert own_inboxes("alice") == "_INBOX.alice."
    for name in ("alice.smith", "*", ">", "a b", ""):
        assert own_inboxes(name) is None, name
