# Fuzzing the Liftbridge-style configuration (riverlog.config_file): YAML files made of known
# keys (nested or dotted) with values of every YAML kind (huge, negative and non-finite numbers,
# booleans, lists, maps, nulls, Go durations right and wrong), random YAML text, and
# LIFTBRIDGE_* variables. The contract (config_file.py): load() raises ConfigError, build()
# ConfigError or ValueError naming the key; nothing else, whatever the input.
from __future__ import annotations

import os
import tempfile

import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from riverlog.config import ServerConfig
from riverlog.config_file import IGNORED_KEYS, KNOWN_KEYS, USED_KEYS, ConfigError, build, load

from ._budget import budget

_KEYS = sorted(KNOWN_KEYS)
_HONOURED = sorted(USED_KEYS | IGNORED_KEYS)  # keys that do not fail load() by their name
_durations = st.from_regex(r"\A-?[0-9]{0,25}(\.[0-9]{0,3})?(ns|us|ms|s|m|h|d|){1,3}\Z")
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(1 << 80), 1 << 80),
    st.floats(), st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e300, -1.5]),
    st.text(max_size=20), _durations,
    st.sampled_from(["always", "never", "interval", "leader", "ALL", "warn", "127.0.0.1:0",
                     ":9292", "[::1]:x", "nats://127.0.0.1:4222", "true", "off", "1e400"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(_KEYS + ["x"]), inner,
                                                 max_size=3)), max_leaves=6)


def _nested(key: str, value, split: int):
    """``a.b.c: v`` as ``a: {b.c: v}`` (split 1), ``a: {b: {c: v}}`` (split 2), ..."""
    parts = key.split(".")
    split = min(split, len(parts) - 1)
    outer = parts[:split] + [".".join(parts[split:])]
    for part in reversed(outer[1:]):
        value = {part: value}
    return outer[0], value


@st.composite
def documents(draw) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=60))
    doc: dict = {}
    keys = st.one_of(st.sampled_from(_HONOURED), st.sampled_from(_HONOURED), st.sampled_from(_KEYS))
    for key in draw(st.lists(keys, min_size=1, max_size=3, unique=True)):
        top, value = _nested(key, draw(values), draw(st.integers(0, 3)))
        if isinstance(doc.get(top), dict) and isinstance(value, dict):
            doc[top].update(value)
        else:
            doc[top] = value
    return yaml.safe_dump(doc, allow_unicode=True)


environments = st.dictionaries(
    st.sampled_from(_KEYS).map(lambda k: "LIFTBRIDGE_" + k.upper().replace(".", "_")),
    st.one_of(st.text(max_size=12), _durations), max_size=3)


@budget(400)
@given(documents(), environments)
def test_load_and_build_raise_only_config_errors(text, environ):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        try:
            settings = load(f.name, environ)
        except ConfigError:
            event("load refused")
            return
        try:
            config, level = build(settings, {})
        except ValueError:  # ConfigError is one
            event("build refused")
            return
        event("built")
        assert isinstance(config, ServerConfig) and level in ("debug", "info", "warning", "error")
    finally:
        os.unlink(f.name)
