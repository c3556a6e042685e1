"""One commit pipeline in code (issue 22, item 4): ``Partition.when_committed`` is the only
place that decides when a confirm or an ack goes out. No module of riverlog but
broker/partition.py awaits ``wait_committed`` or asks ``is_committed`` itself (that would be
the pipeline written again: "if committed now confirm, else await"); the doors' confirms and
acks go through ``when_committed``: the RabbitMQ door's publishing and the Appender every
Liftbridge write goes through (docs/durability.md)."""
import ast
import pathlib

import riverlog

ROOT = pathlib.Path(riverlog.__file__).parent
OWNER = ROOT / "broker" / "partition.py"


def _calls(name: str) -> dict[str, int]:
    """Module path (relative to riverlog/) -> number of calls ``<anything>.<name>(...)``."""
    found: dict[str, int] = {}
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        n = sum(1 for node in ast.walk(tree)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == name)
        if n:
            found[str(path.relative_to(ROOT))] = n
    return found


def test_only_the_partition_waits_for_a_commit():
    owner = str(OWNER.relative_to(ROOT))
    for name in ("wait_committed", "is_committed"):
        assert set(_calls(name)) <= {owner}, name


def test_every_door_confirms_through_when_committed():
    assert set(_calls("when_committed")) == {"broker/appender.py",
                                             "server/rabbitmq_stream/publishing.py"}
