# What `riverlog ctl` prints (cli_ctl.py), as rabbitmqctl prints it
# (deps/rabbitmq_cli/lib/rabbitmq/cli/formatters: table.ex, json.ex, pretty_table.ex):
# - the banner ("Listing users ...") first, unless -q/--quiet, -s/--silent or a
#   machine-readable formatter (json);
# - `table` (the default): a header line of the column names, then one line per item, the
#   values separated by tabs; no header with -s/--silent or --no-table-headers, and none
#   for an empty listing (rabbitmqctl prints the header with the first item);
# - `json`: "[" on a line, then one JSON object per line, each after the first preceded by
#   ",", then "]";
# - `pretty_table`: the same rows in a box-drawn table.
# Rules: pure text out of rows (dicts in column order); printing is the caller's.
from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

FORMATTERS = ("table", "json", "pretty_table")
AMQP_TYPES = frozenset(("longstr", "bool", "signedint", "long", "float", "double", "table",
                        "array", "timestamp"))


def _typed(item: Any) -> bool:
    """A [key, type, value] entry of an AMQP table (client_properties)."""
    return (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
            and item[1] in AMQP_TYPES)


def _quoted(value: Any) -> str:
    return json.dumps(value if isinstance(value, str) else str(value), ensure_ascii=False)


def table_value(value: Any) -> str:
    """One value as rabbitmqctl's table shows it: booleans ``true``/``false``, a list of
    strings ``[a, b]`` (user tags), an AMQP table ([key, type, value] entries, such as
    client_properties) as Erlang's ``[{"key","value"},...]`` (the Java suite's Cli parses
    that), None empty, other lists and maps as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(value) + "]"
    if isinstance(value, list) and value and all(_typed(v) for v in value):
        return "[" + ",".join(f'{{{_quoted(k)},{_quoted(v)}}}' for k, _, v in value) + "]"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(rows: Sequence[dict[str, Any]], header: bool) -> list[str]:
    """Tab-separated lines of ``rows`` (all with the same keys), the header line first when
    ``header`` and there is a row."""
    if not rows:
        return []
    lines = ["\t".join(rows[0])] if header else []
    lines += ["\t".join(table_value(v) for v in row.values()) for row in rows]
    return lines


def json_lines(rows: Iterable[dict[str, Any]]) -> list[str]:
    """rabbitmqctl's JSON stream: ``[``, one object a line (``,`` before all but the first),
    ``]``; the whole is one JSON array."""
    lines = ["["]
    for i, row in enumerate(rows):
        lines.append(("," if i else "") + json.dumps(row, separators=(",", ":")))
    lines.append("]")
    return lines


def pretty_table(rows: Sequence[dict[str, Any]], header: bool) -> list[str]:
    """``rows`` in a box-drawn table (rabbitmqctl's pretty_table), a line between rows."""
    if not rows:
        return []
    cells = [[table_value(v) for v in row.values()] for row in rows]
    if header:
        cells.insert(0, list(rows[0]))
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]

    def rule(left: str, middle: str, right: str) -> str:
        return left + middle.join("─" * (w + 2) for w in widths) + right

    lines = [rule("┌", "┬", "┐")]
    for i, line in enumerate(cells):
        if i:
            lines.append(rule("├", "┼", "┤"))
        lines.append("│" + "│".join(f" {c.ljust(w)} " for c, w in zip(line, widths)) + "│")
    lines.append(rule("└", "┴", "┘"))
    return lines


def render(rows: Sequence[dict[str, Any]], formatter: str, header: bool) -> list[str]:
    """The lines of a listing in ``formatter`` (one of FORMATTERS)."""
    if formatter == "json":
        return json_lines(rows)
    if formatter == "pretty_table":
        return pretty_table(rows, header)
    return table(rows, header)


def columns(arguments: Sequence[str], valid: Sequence[str], default: Sequence[str]
            ) -> list[str]:
    """The info keys asked for: ``arguments`` split at commas too (``conn_name,user``, as
    rabbitmqctl's InfoKeys.prepare_info_keys), else ``default``. Raises ``ValueError``
    naming the keys not in ``valid``."""
    asked = [key.strip() for arg in arguments for key in arg.split(",") if key.strip()]
    unknown = [key for key in asked if key not in valid]
    if unknown:
        raise ValueError(f"Info key(s) {','.join(unknown)} are not supported; valid keys: "
                         f"{', '.join(sorted(valid))}")
    return asked or list(default)
