"""The super stream registry on tmp_path (riverlog.broker.superstreams): partitions created as
ordinary streams with the given settings, routing by binding key, the RabbitMQ checks and
their errors, rollback, persistence across a restart, deletion, a partition deleted alone,
and a damaged file."""
import asyncio
import json
import os

import pytest

from riverlog.broker import Broker, StreamConfig, SuperStreams
from riverlog.errors import InvalidArgumentError, StreamExistsError, StreamNotFoundError


def open_registry(path):
    broker = Broker(str(path))
    broker.open()
    return broker, SuperStreams(broker)


def close(broker):
    asyncio.run(broker.close())


def test_create_route_and_survive_a_restart(tmp_path):
    broker, registry = open_registry(tmp_path)
    created = registry.create("invoices", ["invoices-0", "invoices-1", "invoices-2"],
                              ["0", "1", "2"], StreamConfig(retention_max_bytes=123_456))
    assert created.partitions == ("invoices-0", "invoices-1", "invoices-2")
    for name in created.partitions:
        assert broker.streams[name].config.retention_max_bytes == 123_456
    # routing: exact binding key match, in partition order; nothing for an unknown key
    assert created.route("1") == ["invoices-1"]
    assert created.route("3") == [] and created.route("") == []
    assert registry.partition_index("invoices", "invoices-2") == 2
    assert registry.partition_index("invoices", "other") == -1
    assert registry.partition_index("nope", "invoices-2") == -1
    # a super stream name is not a stream name: both namespaces are separate (as in RabbitMQ)
    assert "invoices" not in broker.streams
    broker.create("invoices")
    close(broker)

    broker, registry = open_registry(tmp_path)
    assert registry.get("invoices") == created
    assert sorted(broker.streams) == ["invoices", "invoices-0", "invoices-1", "invoices-2"]
    close(broker)


def test_binding_keys_may_repeat_and_route_to_every_match(tmp_path):
    broker, registry = open_registry(tmp_path)
    s = registry.create("regions", ["eu", "us", "eu-backup"], ["europe", "america", "europe"])
    assert s.route("europe") == ["eu", "eu-backup"]
    assert s.route("america") == ["us"]
    close(broker)


def test_refusals_create_nothing(tmp_path):
    broker, registry = open_registry(tmp_path)
    with pytest.raises(InvalidArgumentError):
        registry.create("s", ["s-0", "s-1"], ["0"])  # counts differ
    with pytest.raises(InvalidArgumentError):
        registry.create("s", ["s-0", "s-0"], ["0", "1"])  # duplicate partition
    with pytest.raises(InvalidArgumentError):
        registry.create("", ["s-0"], ["0"])
    with pytest.raises(InvalidArgumentError):
        registry.create("s", ["s-0", ""], ["0", "1"])
    with pytest.raises(InvalidArgumentError):
        registry.create("s", ["x" * 256], ["0"])
    broker.create("s-1")
    with pytest.raises(StreamExistsError):
        registry.create("s", ["s-0", "s-1"], ["0", "1"])  # a partition exists already
    assert sorted(broker.streams) == ["s-1"] and registry.super_streams == {}
    registry.create("s", ["s-0"], ["0"])
    with pytest.raises(StreamExistsError):
        registry.create("s", ["t-0"], ["0"])  # the super stream exists
    assert "t-0" not in broker.streams
    close(broker)


def test_failed_partition_creation_rolls_back(tmp_path):
    broker, registry = open_registry(tmp_path)
    # a plain file where the second partition's folder goes: creating it fails on disk
    with open(os.path.join(broker.root, "s-1"), "w") as f:
        f.write("in the way")
    with pytest.raises(OSError):
        registry.create("s", ["s-0", "s-1"], ["0", "1"])
    assert broker.streams == {} and registry.super_streams == {}
    assert not os.path.exists(os.path.join(broker.root, "s-0"))
    assert not os.path.exists(registry.path)
    close(broker)


def test_an_empty_super_stream_is_allowed(tmp_path):
    """RabbitMQ accepts CreateSuperStream with no partitions (an exchange with no binding)."""
    broker, registry = open_registry(tmp_path)
    assert registry.create("empty", [], []).partitions == ()
    assert registry.get("empty").route("0") == []
    close(broker)


def test_delete_removes_partitions_and_metadata(tmp_path):
    broker, registry = open_registry(tmp_path)
    registry.create("a", ["a-0", "a-1"], ["0", "1"])
    registry.create("b", ["b-0"], ["0"])
    registry.delete("a")
    with pytest.raises(StreamNotFoundError):
        registry.get("a")
    with pytest.raises(StreamNotFoundError):
        registry.delete("a")
    assert sorted(broker.streams) == ["b-0"]
    close(broker)
    broker, registry = open_registry(tmp_path)
    assert list(registry.super_streams) == ["b"]
    close(broker)


def test_a_partition_deleted_alone_leaves_its_super_stream(tmp_path):
    broker, registry = open_registry(tmp_path)
    registry.create("a", ["a-0", "a-1", "a-2"], ["0", "1", "2"])
    broker.delete("a-1")
    assert registry.get("a").partitions == ("a-0", "a-2")
    assert registry.get("a").binding_keys == ("0", "2")
    assert registry.get("a").route("1") == []
    broker.create("a-1")  # a new stream of that name is not bound again
    close(broker)
    broker, registry = open_registry(tmp_path)
    assert registry.get("a").partitions == ("a-0", "a-2")
    registry.delete("a")  # the other partitions go; the unbound a-1 stays
    assert sorted(broker.streams) == ["a-1"]
    close(broker)


def test_a_damaged_file_is_set_aside_not_fatal(tmp_path, caplog):
    broker, registry = open_registry(tmp_path)
    registry.create("a", ["a-0"], ["0"])
    close(broker)
    with open(registry.path, "w") as f:
        f.write('{"super_streams": [{"name": "a"')
    broker, registry = open_registry(tmp_path)
    assert registry.super_streams == {}
    assert "cannot read" in caplog.text
    assert os.path.exists(registry.path + ".bad")
    registry.create("b", ["b-0"], ["0"])
    with open(registry.path) as f:
        assert [s["name"] for s in json.load(f)["super_streams"]] == ["b"]
    close(broker)


def test_a_stream_with_several_partitions_is_a_derived_super_stream(tmp_path):
    """Partition i of a broker stream with several partitions (Liftbridge) is the RabbitMQ
    name `<stream>-<i>`, bound with key "i"; a real stream of that name wins; nothing is
    stored for it, and deleting it deletes the broker stream."""
    broker, registry = open_registry(tmp_path)
    orders = broker.create("orders", StreamConfig(partitions=3))
    single = broker.create("single")
    derived = registry.get("orders")
    assert (derived.partitions, derived.binding_keys) == (
        ("orders-0", "orders-1", "orders-2"), ("0", "1", "2"))
    assert registry.partition_index("orders", "orders-2") == 2
    assert registry.resolve("orders-1") == (orders, orders.partitions[1])
    assert registry.resolve("single") == (single, single.partitions[0])
    for name in ("orders", "orders-3", "orders-01", "orders-x", "orders-", "single-0", "nope"):
        assert registry.resolve(name) is None, name
    assert registry.find("single") is None and registry.find("nope") is None
    assert registry.door_names(orders) == ["orders-0", "orders-1", "orders-2"]
    assert registry.door_names(single) == ["single"]
    real = broker.create("orders-1")
    assert registry.resolve("orders-1") == (real, real.partitions[0])
    with pytest.raises(StreamExistsError):
        registry.create("orders", ["o-a"], ["a"])
    with pytest.raises(StreamExistsError):
        registry.create("other", ["orders-2"], ["a"])
    assert registry.super_streams == {}
    registry.delete("orders")
    assert "orders" not in broker.streams and registry.find("orders") is None
    close(broker)
