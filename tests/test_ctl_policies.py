"""`riverlog ctl` set_policy, clear_policy and list_policies run as a separate process (as the
Java stream client's suite runs rabbitmqctl) against an App in this process: the Java
RetentionClientTest's own command line truncates an existing stream's retention, the exact
banners and rows of rabbitmqctl, and its errors and exit codes."""
from __future__ import annotations

import asyncio
import json

import pytest
from rstream import AMQPMessage, Producer

from test_ctl import app, ctl  # noqa: F401 (app: a fixture, one App with its management API)

pytestmark = pytest.mark.timeout(180)


async def _first_offset_moves(app, stream: str) -> None:
    """Publish 1000 x 1000 B to ``stream`` (as the Java test) and wait until retention moved
    its first offset."""
    async with Producer("127.0.0.1", app.rabbitmq_stream.port, username="guest",
                        password="guest") as producer:
        for i in range(1000):
            await producer.send(stream, AMQPMessage(body=b"x" * 1000))
            if i % 100 == 99:
                await producer.send_wait(stream, AMQPMessage(body=b"y"))
    partition = app.broker.streams[stream].partitions[0]
    for _ in range(200):
        if partition.first_offset > 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("retention never truncated the stream")


async def test_the_java_retention_test_command_line(app):
    stream = "retention-test-1"
    async with Producer("127.0.0.1", app.rabbitmq_stream.port, username="guest",
                        password="guest") as producer:
        await producer.create_stream(stream, arguments={"max-length-bytes": 20_000_000_000})
    definition = '{"max-length-bytes":100000,"stream-max-segment-size-bytes":50000 }'
    code, out, err = await ctl(app, "set_policy", "stream-retention-test", stream, definition,
                               "--priority", "1", "--apply-to", "queues")
    assert (code, err) == (0, "")
    assert out == (f'Setting policy "stream-retention-test" for pattern "{stream}" to '
                   f'"{definition}" with priority "1" for vhost "/" ...\n')
    await _first_offset_moves(app, stream)

    code, out, _ = await ctl(app, "list_policies")
    assert code == 0 and out == (
        'Listing policies for vhost "/" ...\n'
        "vhost\tname\tpattern\tapply-to\tdefinition\tpriority\n"
        f"/\tstream-retention-test\t{stream}\tqueues\t"
        '{"max-length-bytes":100000,"stream-max-segment-size-bytes":50000}\t1\n')
    code, out, _ = await ctl(app, "list_policies", "--formatter", "json")
    assert code == 0 and json.loads(out) == [{
        "vhost": "/", "name": "stream-retention-test", "pattern": stream,
        "apply-to": "queues", "priority": 1,
        "definition": {"max-length-bytes": 100000, "stream-max-segment-size-bytes": 50000}}]

    code, out, err = await ctl(app, "clear_policy", "stream-retention-test")
    assert (code, out, err) == (0, 'Clearing policy "stream-retention-test" on vhost "/" ...\n',
                                "")
    assert app.broker.streams[stream].partitions[0].config.retention_max_bytes == 20_000_000_000
    code, out, _ = await ctl(app, "-q", "list_policies")
    assert (code, out) == (0, "")  # an empty listing prints nothing (as rabbitmqctl)


async def test_vhosts_defaults_and_errors(app):
    assert (await ctl(app, "add_vhost", "v1"))[0] == 0
    code, out, _ = await ctl(app, "set_policy", "-p", "v1", "all-v1", ".*",
                             '{"max-age":"1D"}')
    assert code == 0 and out.endswith('with priority "0" for vhost "v1" ...\n')
    code, out, _ = await ctl(app, "-s", "list_policies", "-p", "v1")
    assert (code, out) == (0, 'v1\tall-v1\t.*\tall\t{"max-age":"1D"}\t0\n')
    assert (await ctl(app, "-s", "list_policies"))[1] == ""  # another vhost's
    # errors: rabbitmqctl's reasons and exit codes
    code, _, err = await ctl(app, "clear_policy", "nope")
    assert (code, err) == (70, "Error:\nParameter does not exist\n")
    code, _, err = await ctl(app, "set_policy", "p", ".*", "{nope")
    assert code == 70 and err.startswith("Error:\nJSON decoding error")
    code, _, err = await ctl(app, "set_policy", "p", ".*", '{"foo":"bar"}')
    assert code == 70 and err == ('Error:\nValidation failed\n\n[{<<"foo">>,<<"bar">>}] are '
                                  "not recognised policy settings\n\n")
    code, _, err = await ctl(app, "set_policy", "p", "(", '{"max-age":"1D"}')
    assert code == 70 and "should be regular expression" in err
    code, _, err = await ctl(app, "set_policy", "-p", "nowhere", "p", ".*", '{"max-age":"1D"}')
    assert (code, err) == (65, 'Error:\n{:no_such_vhost, "nowhere"}\n')
    code, _, err = await ctl(app, "list_policies", "-p", "nowhere")
    assert (code, err) == (65, 'Error:\n{:no_such_vhost, "nowhere"}\n')
    code, _, err = await ctl(app, "clear_policy", "-p", "nowhere", "p")
    assert (code, err) == (65, 'Error:\n{:no_such_vhost, "nowhere"}\n')
    assert (await ctl(app, "set_policy", "p", ".*"))[0] == 64  # no definition
    # only administrators and policymakers
    assert (await ctl(app, "add_user", "mo", "mo-pw"))[0] == 0
    code, _, err = await ctl(app, "--username", "mo", "--password", "mo-pw", "set_policy", "p",
                             ".*", '{"max-age":"1D"}')
    assert code == 70 and "Not policymaker" in err
    assert (await ctl(app, "clear_policy", "-p", "v1", "all-v1"))[0] == 0
