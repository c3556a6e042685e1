"""`riverlog ctl` (rabbitmqctl's and rabbitmq-streams' commands) run as a separate process,
as operators and the Java stream client's suite run it, against an App in this process with
its management API on a free port, while real clients (rstream, and raw frames) make the
connections, publishers, consumers and groups it lists. Checks the exact output
(rabbitmqctl's banners, tab-separated header and rows, the JSON stream), that
close_connection closes the client's socket, and rabbitmqctl's exit codes."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import sys

import pytest
from rstream import (Consumer, ConsumerOffsetSpecification, OffsetSpecification, OffsetType,
                     Producer)

from compat._raw import RawPeer
from riverlog.config import LogConfig, ManagementConfig, RabbitStreamConfig, ServerConfig
from riverlog.server.app import App

pytestmark = pytest.mark.timeout(180)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
async def app(tmp_path):
    app = App(ServerConfig(data_dir=str(tmp_path / "data"), log=LogConfig(),
                           rabbitmq_stream=RabbitStreamConfig(port=0, silent_close_delay_ms=0),
                           management=ManagementConfig(port=0)))
    await app.start()
    yield app
    await app.stop()


def url(app: App) -> str:
    return f"http://127.0.0.1:{app.management.port}"


async def run(*argv: str, stdin: bytes | None = None, env: dict | None = None
              ) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one command line (argv[0] the program)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert "Traceback" not in err.decode(), err.decode()
    return proc.returncode, out.decode(), err.decode()


async def ctl(app: App | None, *args: str, **kwargs) -> tuple[int, str, str]:
    """`python -m riverlog.cli_ctl --url <app's management API> ARGS` (what
    scripts/rabbitmqctl runs)."""
    where = ("--url", url(app)) if app is not None else ()
    return await run(sys.executable, "-m", "riverlog.cli_ctl", *where, *args, **kwargs)


def names(app: App) -> dict[str, str]:
    """connection_name client property -> RabbitMQ connection name, from the door."""
    from riverlog.server.management.connections import connection_name
    return {c.link.client_properties.get("connection_name", ""): connection_name(c)
            for c in app.rabbitmq_stream.connections if c.link.user is not None}


async def test_list_stream_connections_table_quiet_silent_and_json(app):
    port = app.rabbitmq_stream.port
    async with Producer("127.0.0.1", port, username="guest", password="guest",
                        connection_name="ctl-producer") as producer:
        await producer.create_stream("orders")
        consumer = Consumer("127.0.0.1", port, username="guest", password="guest",
                            connection_name="ctl-consumer")
        await consumer.start()
        await consumer.subscribe("orders", lambda msg, ctx: None)
        try:
            await producer.send_wait("orders", b"x")  # its publishing connection is open
            named = names(app)  # rstream's consumer has a locator connection too
            assert {"ctl-producer", "ctl-consumer"} <= set(named)
            rc, out, err = await ctl(app, "list_stream_connections", "conn_name", "user",
                                     "vhost", "subscriptions")
            assert rc == 0, err
            lines = out.splitlines()
            assert lines[:2] == ["Listing stream connections ...",
                                 "conn_name\tuser\tvhost\tsubscriptions"]
            assert sorted(lines[2:]) == sorted(
                f"{name}\tguest\t/\t{int(label == 'ctl-consumer')}"
                for label, name in named.items())
            # default column conn_name; -q drops the banner only, -s the header too
            rc, out, _ = await ctl(app, "-q", "list_stream_connections")
            assert rc == 0 and out.splitlines()[0] == "conn_name"
            assert sorted(out.splitlines()[1:]) == sorted(named.values())
            rc, out, _ = await ctl(app, "list_stream_connections", "--silent", "user")
            assert rc == 0 and out.splitlines() == ["guest"] * len(named)
            rc, out, _ = await ctl(app, "list_stream_connections", "--no-table-headers",
                                   "user,vhost")
            assert out.splitlines() == ["Listing stream connections ..."] + ["guest\t/"] * len(
                named)
            # the Java suite's call: no banner, one JSON array, client_properties as
            # [key, type, value] triples
            rc, out, _ = await ctl(app, "list_stream_connections", "--formatter", "json",
                                   "conn_name,client_properties")
            assert rc == 0
            lines = out.splitlines()
            assert lines[0] == "[" and lines[-1] == "]" and lines[2].startswith(",{")
            listed = json.loads(out)
            provided = {next(v for k, t, v in c["client_properties"]
                             if k == "connection_name"): c["conn_name"] for c in listed}
            assert provided == named
            assert all(list(c) == ["conn_name", "client_properties"] for c in listed)
            # the Java suite's Cli.listConnections: a table it splits at tabs, client
            # properties as Erlang's [{"key","value"},...]
            rc, out, _ = await ctl(app, "list_stream_connections", "-q", "--formatter",
                                   "table", "conn_name,pid,client_properties")
            lines = out.splitlines()
            assert rc == 0 and lines[0] == "conn_name\tpid\tclient_properties"
            parsed = {}
            for line in lines[1:]:
                conn, pid, properties = line.split("\t")
                entries = (properties.replace("[", "").replace("]", "").replace("},{", "|")
                           .replace("{", "").replace("}", "").split("|"))
                pairs = dict((e.split('","')[0][1:], e.split('","')[1][:-1]) for e in entries)
                assert pid == conn and pairs["product"] == "RabbitMQ Stream"
                parsed[pairs["connection_name"]] = conn
            assert parsed == named
        finally:
            await consumer.close()


async def test_list_stream_publishers_and_consumers(app):
    port = app.rabbitmq_stream.port
    async with Producer("127.0.0.1", port, username="guest", password="guest") as producer:
        await producer.create_stream("orders")
        for i in range(3):
            await producer.send_wait("orders", b"m%d" % i)
        consumer = Consumer("127.0.0.1", port, username="guest", password="guest")
        await consumer.start()
        got = []
        all_in = asyncio.Event()

        async def on_message(msg, ctx):
            got.append(ctx.offset)
            if len(got) == 3:
                all_in.set()
        await consumer.subscribe("orders", on_message, offset_specification=(
            ConsumerOffsetSpecification(OffsetType.FIRST)))
        try:
            await asyncio.wait_for(all_in.wait(), 30)
            rc, out, err = await ctl(app, "list_stream_publishers")
            assert rc == 0, err
            lines = out.splitlines()
            assert lines[:2] == ["Listing stream publishers ...",
                                 "publisher_id\tstream\treference\tmessages_published\t"
                                 "messages_confirmed\tmessages_errored"]
            assert len(lines) == 3
            _, stream, _, published, confirmed, errored = lines[2].split("\t")
            assert (stream, published, confirmed, errored) == ("orders", "3", "3", "0")

            rc, out, err = await ctl(app, "list_stream_consumers", "-p", "/")
            assert rc == 0, err
            lines = out.splitlines()
            assert lines[:2] == ["Listing stream consumers ...",
                                 "subscription_id\tstream\tmessages_consumed\toffset\t"
                                 "offset_lag\tcredits\tactive\tactivity_status\tproperties"]
            row = lines[2].split("\t")
            assert row[1:3] == ["orders", "3"] and row[6:8] == ["true", "up"]
            # -V: every column, connection_pid being the connection's name
            rc, out, _ = await ctl(app, "-q", "list_stream_consumers", "-V",
                                   "--formatter", "json")
            (listed,) = json.loads(out)
            assert list(listed)[:3] == ["connection_pid", "node", "subscription_id"]
            from riverlog.server.management.connections import connection_name
            subscribed = [connection_name(c) for c in app.rabbitmq_stream.connections
                          if c.subscriptions]
            assert subscribed == [listed["connection_pid"]] and listed["stream"] == "orders"
            assert listed["node"].startswith("rabbit@")
        finally:
            await consumer.close()


async def test_consumer_groups_and_group_consumers(app):
    port = app.rabbitmq_stream.port
    app.broker.create("sacs")
    rc, out, _ = await ctl(app, "list_stream_consumer_groups")
    assert rc == 0 and out.splitlines() == ["Listing stream consumer groups ..."]
    members = []
    for label in ("first", "second"):
        consumer = Consumer("127.0.0.1", port, username="guest", password="guest",
                            connection_name=label)
        await consumer.start()

        async def on_update(active, ctx):
            return OffsetSpecification(OffsetType.FIRST, 0)
        await consumer.subscribe("sacs", lambda msg, ctx: None, properties={
            "single-active-consumer": "true", "name": "grp"},
            consumer_update_listener=on_update)
        members.append(consumer)
    try:
        rc, out, err = await ctl(app, "list_stream_consumer_groups")
        assert rc == 0, err
        assert out.splitlines() == ["Listing stream consumer groups ...",
                                    "stream\treference\tpartition_index\tconsumers",
                                    "sacs\tgrp\t-1\t2"]
        named = names(app)
        rc, out, err = await ctl(app, "list_stream_group_consumers", "--stream", "sacs",
                                 "--reference", "grp", "connection_name", "state")
        assert rc == 0, err
        assert out.splitlines() == ["Listing group consumers ...", "connection_name\tstate",
                                    f"{named['first']}\tactive",
                                    f"{named['second']}\tinactive"]
        rc, out, err = await ctl(app, "list_stream_group_consumers", "--stream", "sacs",
                                 "--reference", "nope")
        assert rc == 70 and err.strip() == "The group does not exist"
        rc, _, err = await ctl(app, "list_stream_group_consumers", "--stream", "sacs")
        assert rc == 64 and "--reference" in err
    finally:
        for consumer in members:
            await consumer.close()


async def test_close_connection_closes_the_clients_socket(app):
    peer = await RawPeer.open("127.0.0.1", app.rabbitmq_stream.port)
    local_port = peer.writer.get_extra_info("sockname")[1]
    rc, out, _ = await ctl(app, "-s", "list_stream_connections")
    (name,) = [n for n in out.splitlines() if n.startswith(f"127.0.0.1:{local_port} ->")]
    rc, out, err = await ctl(app, "close_connection", name, "go away")
    assert rc == 0, err
    assert out.splitlines() == [f"Closing connection {name}, reason: go away..."]
    assert await asyncio.wait_for(peer.reader.read(), 10) == b""  # the server closed it
    rc, out, _ = await ctl(app, "-s", "list_stream_connections")
    assert name not in out.splitlines()
    rc, _, err = await ctl(app, "close_connection", name, "again")
    assert rc == 65 and f'no connection named "{name}"' in err
    peer.writer.close()


async def test_super_streams_and_list_queues(app):
    rc, out, err = await ctl(app, "add_super_stream", "inv", "--partitions", "2",
                             "--max-age", "PT10M", "--max-length-bytes", "1mb")
    assert rc == 0, err
    assert out.splitlines() == ["Adding a super stream...", "Super stream inv has been created"]
    rc, out, err = await ctl(app, "add_super_stream", "bk", "--binding-keys", "a, b")
    assert rc == 0, err
    rc, out, err = await ctl(app, "list_queues")
    assert rc == 0, err
    assert out.splitlines() == ["Timeout: 60.0 seconds ...", "Listing queues for vhost / ...",
                                "name\tmessages", "bk-a\t0", "bk-b\t0", "inv-0\t0",
                                "inv-1\t0"]
    rc, out, _ = await ctl(app, "-q", "list_queues", "name", "arguments", "--formatter", "json")
    arguments = {q["name"]: q["arguments"] for q in json.loads(out)}
    assert arguments["inv-1"] == {"x-queue-type": "stream", "x-max-age": "600s",
                                  "x-max-length-bytes": 1000000}  # mb: 1000²
    assert app.rabbitmq_stream.super_streams.get("bk").binding_keys == ("a", "b")
    assert app.rabbitmq_stream.super_streams.get("inv").binding_keys == ("0", "1")

    rc, _, err = await ctl(app, "add_super_stream", "inv")
    assert rc == 70 and "already exists" in err
    rc, out, err = await ctl(app, "delete_super_stream", "inv")
    assert rc == 0, err
    assert out.splitlines() == ["Deleting a super stream...", "Super stream inv has been deleted"]
    assert "inv-0" not in app.broker.streams and app.rabbitmq_stream.super_streams.find(
        "inv") is None
    rc, _, err = await ctl(app, "delete_super_stream", "inv")
    assert rc == 70 and err.startswith("Error:")
    for bad, message in ((("--partitions", "0"), "The partition number must be greater than 0"),
                         (("--partitions", "2", "--binding-keys", "a"),
                          "Specify --partitions or --binding-keys, not both."),
                         (("--max-age", "10 minutes"), "Invalid value for --max-age"),
                         (("--max-length-bytes", "lots"), "Invalid value for --max-length-bytes"),
                         (("--leader-locator", "mine"), "Invalid value for --leader-locator")):
        rc, out, err = await ctl(app, "add_super_stream", "bad", *bad)
        assert rc == 64 and message in err, (bad, err)
    assert app.rabbitmq_stream.super_streams.find("bad") is None


async def test_vhosts_and_status(app):
    rc, out, err = await ctl(app, "list_vhosts")
    assert rc == 0, err
    assert out.splitlines() == ["Listing vhosts ...", "name", "/"]
    rc, out, _ = await ctl(app, "list_vhosts", "name", "default_queue_type", "--formatter",
                           "json")
    assert json.loads(out) == [{"name": "/", "default_queue_type": "stream"}]
    rc, out, _ = await ctl(app, "list_vhosts", "--formatter", "pretty_table")
    assert out.splitlines()[1:] == ["┌──────┐", "│ name │", "├──────┤", "│ /    │", "└──────┘"]
    # virtual hosts at runtime (issue 30 item 1)
    rc, out, err = await ctl(app, "add_vhost", "qa", "--description", "for QA")
    assert rc == 0 and out.splitlines() == ['Adding vhost "qa" ...'], err
    rc, out, _ = await ctl(app, "list_vhosts", "name", "description", "--formatter", "json")
    assert json.loads(out) == [{"name": "/", "description": "Default virtual host"},
                               {"name": "qa", "description": "for QA"}]
    rc, out, err = await ctl(app, "set_permissions", "-p", "qa", "guest", ".*", ".*", ".*")
    assert rc == 0, err
    rc, out, err = await ctl(app, "-q", "list_permissions", "-p", "qa")
    assert rc == 0 and out.splitlines() == ["user\tconfigure\twrite\tread",
                                            "guest\t.*\t.*\t.*"], (out, err)
    rc, out, err = await ctl(app, "delete_vhost", "qa")
    assert rc == 0 and out.splitlines() == ['Deleting vhost "qa" ...'], err
    rc, out, err = await ctl(app, "delete_vhost", "qa")
    assert rc == 65 and '{:no_such_vhost, "qa"}' in err

    rc, out, err = await ctl(app, "status")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("Status of node rabbit@") and lines[0].endswith(" ...")
    assert "RabbitMQ version: 3.13.0" in lines and "Product name: riverlog" in lines
    assert f"OS PID: {os.getpid()}" in lines
    assert (f"Interface: 127.0.0.1, port: {app.rabbitmq_stream.port}, protocol: stream, "
            "purpose: stream protocol") in lines
    assert not any("stream/ssl" in line for line in lines)  # no TLS listener here
    rc, out, _ = await ctl(app, "status", "--formatter", "json")
    assert json.loads(out)["product_name"] == "riverlog"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_exit_codes_and_errors(app):
    rc, out, err = await ctl(None, "--url", f"http://127.0.0.1:{_closed_port()}", "list_vhosts")
    assert rc == 69 and "unable to connect to the management API" in err
    rc, _, err = await ctl(app, "no_such_command")
    assert rc == 64 and "No such command 'no_such_command'" in err
    rc, _, err = await ctl(app, "list_stream_connections", "conn_name", "nope")
    assert rc == 64 and "Info key(s) nope are not supported" in err
    rc, _, err = await ctl(app, "close_connection", "only-one-argument")
    assert rc == 64 and "Missing argument" in err
    rc, _, err = await ctl(app, "--formatter", "xml", "list_vhosts")
    assert rc == 64
    rc, _, err = await ctl(app, "--password", "wrong", "list_vhosts")
    assert rc == 77 and "refused user 'guest'" in err
    rc, out, err = await ctl(app)
    assert rc == 64 and "Missing command" in err
    rc, out, _ = await ctl(None)
    assert rc == 64 and "list_stream_connections" in out
    # the environment names the server and the user
    rc, out, err = await ctl(None, "-q", "list_vhosts",
                             env={"RIVERLOG_MANAGEMENT_URL": url(app),
                                  "RIVERLOG_MANAGEMENT_PASSWORD": "guest"})
    assert rc == 0 and out.splitlines() == ["name", "/"], err


async def test_restart_stream_ends_its_publishers_and_subscriptions(app):
    """rabbitmq-streams restart_stream, as the Java suite's SacStreamConsumerTest runs it
    (the script beside -Drabbitmqctl.bin): the publishers and subscriptions on the stream end
    with one MetadataUpdate (0x06) and those on other streams go on, as when RabbitMQ
    restarts a stream's members; prints the banner and the leader node; a stream it does
    not have is `:not_found`, exit 70 (before: "No such command", exit 64)."""
    from riverlog.protocol.rabbitmq_stream import ResponseCode
    from riverlog.protocol.rabbitmq_stream import frames as f
    from riverlog.protocol.rabbitmq_stream.constants import OffsetType as Offset
    peer = await RawPeer.open("127.0.0.1", app.rabbitmq_stream.port)
    for i, stream in enumerate(("orders", "other"), start=1):
        for frame in (f.Create(peer.next_corr(), stream, {}),
                      f.DeclarePublisher(peer.next_corr(), i, None, stream),
                      f.Subscribe(peer.next_corr(), i, stream, Offset.FIRST, None, 1)):
            assert (await peer.request(frame)).response_code == ResponseCode.OK
    where = {"RIVERLOG_MANAGEMENT_URL": url(app), "RIVERLOG_PYTHON": sys.executable}
    streams = os.path.join(REPO, "scripts", "rabbitmq-streams")
    rc, out, err = await run(streams, "restart_stream", "orders", env=where)
    assert rc == 0, err
    banner, node = out.splitlines()
    assert banner == "Restarting stream orders..." and node.startswith("rabbit@")
    assert await peer.recv_until(f.MetadataUpdate) == f.MetadataUpdate(
        ResponseCode.STREAM_NOT_AVAILABLE, "orders")
    rc, out, _ = await ctl(app, "-q", "list_stream_consumers", "subscription_id", "stream")
    assert out.splitlines() == ["subscription_id\tstream", "2\tother"]
    rc, out, _ = await ctl(app, "-q", "list_stream_publishers", "publisher_id", "stream")
    assert out.splitlines() == ["publisher_id\tstream", "2\tother"]
    rc, out, err = await run(streams, "restart_stream", "nothing", env=where)
    assert (rc, out.splitlines(), err.strip()) == (70, ["Restarting stream nothing..."],
                                                    "Error:\n:not_found")
    peer.writer.close()


async def test_riverlog_ctl_and_the_rabbitmqctl_script(app):
    riverlog = os.path.join(os.path.dirname(sys.executable), "riverlog")
    rc, out, err = await run(riverlog, "ctl", "--url", url(app), "list_vhosts", "-q")
    assert rc == 0 and out.splitlines() == ["name", "/"], err
    where = {"RIVERLOG_MANAGEMENT_URL": url(app), "RIVERLOG_PYTHON": sys.executable}
    rc, out, err = await run(os.path.join(REPO, "scripts", "rabbitmqctl"), "list_vhosts",
                             "-s", env=where)
    assert rc == 0 and out.splitlines() == ["/"], err
    # the Java suite runs rabbitmq-streams from the folder of -Drabbitmqctl.bin
    rc, out, err = await run(os.path.join(REPO, "scripts", "rabbitmq-streams"),
                             "list_stream_consumer_groups", env=where)
    assert rc == 0 and out.splitlines() == ["Listing stream consumer groups ..."], err
    rc, out, _ = await run(riverlog, "ctl", "--help")
    assert rc == 0 and all(c in out for c in (
        "list_stream_connections", "list_stream_group_consumers", "add_user",
        "set_permissions", "add_super_stream", "status"))
    rc, out, _ = await run(riverlog, "ctl", "list_stream_group_consumers", "--help")
    assert rc == 0 and "--stream" in out and "--reference" in out
    rc, out, _ = await run(riverlog, "--help")
    assert rc == 0 and "ctl" in out


async def _logs_in(app: App, user: str, password: str) -> bool:
    """Whether ``user`` with ``password`` opens a RabbitMQ Stream connection."""
    try:
        peer = await RawPeer.open("127.0.0.1", app.rabbitmq_stream.port, user, password)
    except (AssertionError, Exception):
        return False
    peer.writer.close()
    return True


async def test_users_and_permissions(app):
    done = ("Done. Don't forget to grant the user permissions to some virtual hosts! See "
            "'rabbitmqctl help set_permissions' to learn more.")
    rc, out, err = await ctl(app, "add_user", "alice", "s3cret")
    assert rc == 0, err
    assert out.splitlines() == ['Adding user "alice" ...', done]
    assert await _logs_in(app, "alice", "s3cret") and not await _logs_in(app, "alice", "nope")
    rc, _, err = await ctl(app, "add_user", "alice", "other")
    assert rc == 70 and err.strip() == 'User "alice" already exists'
    assert await _logs_in(app, "alice", "s3cret")
    rc, out, err = await ctl(app, "-q", "add_user", "bob", stdin=b"from-stdin\n")
    assert rc == 0 and out == "", err
    assert await _logs_in(app, "bob", "from-stdin")
    rc, _, err = await ctl(app, "add_user", "carol", stdin=b"")
    assert rc == 65 and "Password is not provided via argument or stdin" in err
    rc, _, err = await ctl(app, "add_user", "", "x")
    assert rc == 65 and "user cannot be an empty string" in err

    rc, out, err = await ctl(app, "list_users")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[:2] == ["Listing users ...", "user\ttags"]
    assert {"alice\t[]", "bob\t[]"} <= set(lines[2:])
    rc, out, _ = await ctl(app, "list_users", "--formatter", "json")
    assert {"user": "alice", "tags": []} in json.loads(out)

    rc, out, err = await ctl(app, "change_password", "alice", "n3w")
    assert rc == 0 and out.splitlines() == ['Changing password for user "alice" ...'], err
    assert await _logs_in(app, "alice", "n3w") and not await _logs_in(app, "alice", "s3cret")
    rc, _, err = await ctl(app, "change_password", "nobody", "x")
    assert rc == 67 and '{:no_such_user, "nobody"}' in err

    rc, out, err = await ctl(app, "set_permissions", "-p", "/", "alice", "^a.*", "^a.*", ".*")
    assert rc == 0, err
    assert out.splitlines() == ['Setting permissions for user "alice" in vhost "/" ...']
    rc, out, err = await ctl(app, "list_permissions")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[:2] == ['Listing permissions for vhost "/" ...', "user\tconfigure\twrite\tread"]
    assert "alice\t^a.*\t^a.*\t.*" in lines[2:]
    rc, _, err = await ctl(app, "set_permissions", "nobody", ".*", ".*", ".*")
    assert rc == 67 and '{:no_such_user, "nobody"}' in err
    rc, _, err = await ctl(app, "set_permissions", "alice", ".*", ".*")
    assert rc == 64 and "Missing argument" in err
    rc, _, err = await ctl(app, "list_permissions", "-p", "nope")
    assert rc == 65 and '{:no_such_vhost, "nope"}' in err

    rc, out, err = await ctl(app, "clear_permissions", "alice")
    assert rc == 0, err
    assert out.splitlines() == ['Clearing permissions for user "alice" in vhost "/" ...']
    rc, out, _ = await ctl(app, "-s", "list_permissions")
    assert not any(line.startswith("alice\t") for line in out.splitlines())
    rc, _, err = await ctl(app, "clear_permissions", "alice")
    assert rc == 0, err  # nothing to clear is no error, as rabbitmqctl
    rc, _, err = await ctl(app, "clear_permissions", "nobody")
    assert rc == 67 and '{:no_such_user, "nobody"}' in err

    rc, out, err = await ctl(app, "delete_user", "alice")
    assert rc == 0 and out.splitlines() == ['Deleting user "alice" ...'], err
    assert not await _logs_in(app, "alice", "n3w")
    rc, _, err = await ctl(app, "delete_user", "alice")
    assert rc == 67 and err.strip() == 'Error:\n{:no_such_user, "alice"}'
    rc, out, _ = await ctl(app, "-s", "list_users")
    assert not any(line.startswith("alice\t") for line in out.splitlines())


async def test_status_names_the_tls_listener(tmp_path):
    """The Java suite's TlsTest and OffsetTest look for `stream/ssl` in rabbitmqctl status to
    know whether the server has TLS."""
    from riverlog.config import SecurityConfig, TlsConfig
    from security._certs import Authority
    pem = Authority(str(tmp_path)).issue("localhost", server=True)
    app = App(ServerConfig(data_dir=str(tmp_path / "data"), log=LogConfig(),
                           rabbitmq_stream=RabbitStreamConfig(port=0, tls_port=0,
                                                              silent_close_delay_ms=0),
                           management=ManagementConfig(port=0),
                           security=SecurityConfig(tls=TlsConfig(pem.cert, pem.key))))
    await app.start()
    try:
        rc, out, err = await ctl(app, "status")
        assert rc == 0, err
        assert (f"Interface: 127.0.0.1, port: {app.rabbitmq_stream.tls_port}, protocol: "
                "stream/ssl, purpose: stream protocol over TLS") in out.splitlines()
    finally:
        await app.stop()


def test_node_names_sizes_and_durations():
    """-n as rabbitmqctl's node names map to management URLs; add_super_stream's sizes and
    durations as RabbitMQ reads them (rabbit_resource_monitor_misc, rabbit_date_time)."""
    from riverlog.cli_ctl_admin import duration_seconds, information_unit
    from riverlog.ctl_client import node_url
    assert node_url("rabbit@broker1") == "http://broker1:15672"
    assert node_url("broker1:15673") == "http://broker1:15673"
    assert node_url("https://b:1") == "https://b:1" and node_url(None) is None
    assert [information_unit(v) for v in ("20gb", "500mb", "1kb", "1k", "2KiB", "3M", "7",
                                          "lots", "1.5gb", "")] == [
        20 * 1000 ** 3, 500 * 1000 ** 2, 1000, 1024, 2048, 3 * 1024 ** 2, 7, None, None, None]
    assert [duration_seconds(v) for v in ("PT10M30S", "P5DT8H", "P1Y2M", "PT1S", "P", "PT",
                                          "10m", "P1DT")] == [
        630, 5 * 86400 + 8 * 3600, 365 * 86400 + 60 * 86400, 1, None, None, None, None]
