# Option parsing and offset planning of the Spark source: pure functions, no Spark, no server.
from __future__ import annotations

import pytest

from riverlog.security.tls import ClientTLS
from riverlog.spark import offsets as plan
from riverlog.spark.options import read_options, write_options


def test_read_options_defaults_and_parsing():
    o = read_options({"stream": "a, b,a", "servers": "h1:1,h2", "minPartitions": "4",
                      "MAXOFFSETSPERTRIGGER": "10", "failOnDataLoss": "false",
                      "startingOffsets": '{"a": {"0": 5}}', "endingOffsets": "latest"})
    assert o.streams == ("a", "b")
    assert o.connection.servers == (("h1", 1), ("h2", 5552))
    assert (o.min_partitions, o.max_offsets_per_trigger, o.fail_on_data_loss) == (4, 10, False)
    assert o.starting == {"a": {"0": 5}} and o.ending == "latest"
    assert read_options({"stream": "x"}).starting is None


@pytest.mark.parametrize("options, message", [
    ({}, "stream is required"),
    ({"stream": "a", "startingOffsets": "soon"}, "startingOffsets"),
    ({"stream": "a", "startingOffsets": '{"b": {"0": 1}}'}, "not in option stream"),
    ({"stream": "a", "startingOffsets": '{"a": {"x": 1}}'}, "bad entry"),
    ({"stream": "a", "endingOffsets": "earliest"}, "endingOffsets"),
    ({"stream": "a", "endingOffsets": '{"a": {"0": -2}}'}, "bad entry"),
    ({"stream": "a", "minPartitions": "0"}, "minPartitions"),
    ({"stream": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"stream": "a", "servers": "h:notaport"}, "servers"),
])
def test_read_options_errors(options, message):
    with pytest.raises(ValueError, match=message):
        read_options(options)


def test_tls_options():
    assert read_options({"stream": "a"}).connection.tls is None
    assert read_options({"stream": "a", "tls": "false"}).connection.tls is None
    assert read_options({"stream": "a", "tls": "true"}).connection.tls == ClientTLS()
    o = read_options({"stream": "a", "TLS.CA": "ca.pem", "tls.cert": "c.pem", "tls.key": "c.key",
                      "tls.serverName": "riverlog.example"})
    assert o.connection.tls == ClientTLS("ca.pem", "c.pem", "c.key", "riverlog.example")
    assert write_options({"stream": "a", "tls.ca": "ca.pem"}).connection.tls == ClientTLS("ca.pem")
    with pytest.raises(ValueError, match="tls.cert and tls.key"):
        read_options({"stream": "a", "tls.cert": "c.pem"})
    with pytest.raises(ValueError, match="option tls: expected true or false"):
        read_options({"stream": "a", "tls": "sometimes"})
    assert read_options({"stream": "a"}).connection.mechanism == "PLAIN"
    assert read_options({"stream": "a", "saslMechanism": "external"}).connection.mechanism == \
        "EXTERNAL"
    with pytest.raises(ValueError, match="saslMechanism"):
        read_options({"stream": "a", "saslMechanism": "GSSAPI"})


def test_write_options():
    o = write_options({"stream": "out", "rowOrder": "sorted", "createStream": "true",
                       "max-age": "1h"})
    assert (o.stream, o.row_order, o.create, o.arguments) == ("out", "sorted", True,
                                                               {"max-age": "1h"})
    with pytest.raises(ValueError, match="exactly one"):
        write_options({"stream": "a,b"})
    with pytest.raises(ValueError, match="rowOrder"):
        write_options({"stream": "a", "rowOrder": "random"})


def test_split_min_partitions():
    rs = [plan.Range("a", 0, 0, 1000), plan.Range("b", 0, 10, 10), plan.Range("c", 0, 5, 105)]
    assert plan.split(rs, None) == [rs[0], rs[2]]
    pieces = plan.split(rs, 5)
    assert [p for p in pieces if p.stream == "c"] == [plan.Range("c", 0, 5, 105)]
    a = [(p.start, p.end) for p in pieces if p.stream == "a"]
    assert a == [(0, 200), (200, 400), (400, 600), (600, 800), (800, 1000)]
    assert plan.split([plan.Range("a", 0, 0, 3)], 10) == [
        plan.Range("a", 0, 0, 1), plan.Range("a", 0, 1, 2), plan.Range("a", 0, 2, 3)]


def test_limit_shares_by_backlog():
    start = {"a": {"0": 0}, "b": {"0": 100}}
    latest = {"a": {"0": 300}, "b": {"0": 200}}
    assert plan.limit(start, latest, 1000) == latest
    assert plan.limit(start, latest, 100) == {"a": {"0": 75}, "b": {"0": 125}}
    assert plan.limit({"a": {"0": 0}, "b": {"0": 0}}, {"a": {"0": 1000}, "b": {"0": 1}}, 10) \
        == {"a": {"0": 9}, "b": {"0": 1}}


def test_check_loss():
    first, end = {"a": {"0": 50}}, {"a": {"0": 80}}
    assert plan.check_loss({"a": {"0": 60}}, first, end, True) == {"a": {"0": 60}}
    assert plan.check_loss({"a": {"0": 10}}, first, end, False) == {"a": {"0": 50}}
    with pytest.raises(plan.DataLossError, match="10..49"):
        plan.check_loss({"a": {"0": 10}}, first, end, True)
    with pytest.raises(plan.DataLossError, match="recreated"):
        plan.check_loss({"a": {"0": 99}}, first, end, True)


def test_address():
    assert plan.address("s", 0) == "s"
    with pytest.raises(ValueError):
        plan.address("s", 1)
