"""Virtual hosts in the runtime access table (issue 30 item 1): the changes as pure functions,
the JSON form of DATA/access.json (files written before virtual hosts still load), a table
pickled before virtual hosts (a Raft snapshot) still unpickles, and the Authorizer deciding
another virtual host's stream by that virtual host's permission only."""
from __future__ import annotations

import pickle

import pytest

from riverlog.security.access_table import (AccessError, AccessTable, NoSuchPermission,
                                            NoSuchVhost, Permission, clear_permissions,
                                            delete_user, delete_vhost, from_json, put_user,
                                            put_vhost, set_permissions, to_json)
from riverlog.security.authz import CONSUME, CREATE, PUBLISH, Authorizer
from riverlog.vhost_names import external, hidden, in_vhost, internal, lookup


def test_the_encoding_is_one_to_one_and_hides_every_other_vhost():
    assert internal("/", "s") == "s" and not hidden("s")
    for vhost, name in (("v", "s"), ("v", "\x1fw\x1fs"), ("a b", "x/y"), ("v", "")):
        broker = internal(vhost, name)
        assert hidden(broker) and external(broker) == (vhost, name)
        assert in_vhost(broker, vhost) and not in_vhost(broker, "/")
    assert not in_vhost(internal("vv", "s"), "v")
    # a client's name that starts with the mark reaches nothing of another vhost
    assert lookup("/", internal("v", "s")) == "" and lookup("w", internal("v", "s")) == \
        internal("w", "")


def test_changes():
    table, created = put_vhost(AccessTable(), "v", "d", ("b", "a"))
    assert created and table.vhost("v").tags == ("a", "b") and table.has_vhost("/")
    table, created = put_vhost(table, "v", "again")
    assert not created and table.vhost("v").description == "again"
    assert [v.name for v in table.every_vhost()] == ["/", "v"]
    for bad in ("", "a\x1fb", "n" * 256, 5):
        with pytest.raises(AccessError):
            put_vhost(table, bad)
    table, _ = put_user(table, "al", "")
    with pytest.raises(AccessError, match="vhost_or_user_not_found"):
        set_permissions(table, "al", ".*", ".*", ".*", runtime=True, vhost="nowhere")
    table, created = set_permissions(table, "al", "c", "w", "r", runtime=True, vhost="v")
    assert created and table.permission("v", "al") == Permission("c", "w", "r")
    assert table.permission("/", "al") is None
    with pytest.raises(NoSuchPermission):
        clear_permissions(table, "al")  # none on /
    kept, _ = delete_user(table, "al")
    assert kept.vhost_permissions == {}
    with pytest.raises(AccessError):
        delete_vhost(table, "/")
    with pytest.raises(NoSuchVhost):
        delete_vhost(table, "nowhere")
    table, _ = delete_vhost(table, "v")
    assert not table.has_vhost("v") and table.vhost_permissions == {}


def test_json_and_pickles_of_before_vhosts_still_load():
    table, _ = put_vhost(AccessTable(), "v", "d", ("t",))
    table, _ = put_user(table, "al", "")
    table, _ = set_permissions(table, "al", "a", "b", "c", vhost="v")
    table, _ = set_permissions(table, "al", "x", "y", "z")
    assert from_json(to_json(table)) == table
    old = {"users": [], "permissions": []}  # an access.json written before virtual hosts
    assert from_json(old) == AccessTable()
    assert pickle.loads(pickle.dumps(table)) == table
    # a table pickled before virtual hosts carried two fields
    before = AccessTable.__new__(AccessTable)
    before.__setstate__([{}, {"al": Permission("a", "", "")}])
    assert before.vhosts == {} and before.vhost_permissions == {}
    assert before.permissions == {"al": Permission("a", "", "")}


def test_another_vhosts_stream_is_decided_by_that_vhosts_permission():
    authorizer = Authorizer(True, (("p", "al", "*", "*"),))  # every stream of / by policy
    authorizer.set_runtime({}, [], [], {("v", "al"): Permission("^s$", "", "^s$")})
    assert authorizer.allowed("al", "anything", CREATE)  # /: the policy lines
    assert authorizer.allowed("al", internal("v", "s"), CREATE)
    assert authorizer.allowed("al", internal("v", "s"), CONSUME)
    assert not authorizer.allowed("al", internal("v", "s"), PUBLISH)
    assert not authorizer.allowed("al", internal("v", "t"), CREATE)
    assert not authorizer.allowed("al", internal("w", "s"), CREATE)  # no permission on w
    assert authorizer.vhost_access("al", "v") and not authorizer.vhost_access("al", "w")
    assert authorizer.vhost_access("al", "/")
    off = Authorizer(False, ())
    assert off.vhost_access("anyone", "w") and off.allowed("anyone", internal("w", "s"),
                                                           CREATE)
