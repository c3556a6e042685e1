# The compiled twins (riverlog/_compiled.py) for the tests that hold them to their Python
# reference: ``compiled_or_skip(name)`` imports one directly (RIVERLOG_NO_EXTENSIONS does not
# apply here: both implementations are always tested). A twin that is not built fails the test
# where it could have been built (a C compiler on PATH, or RIVERLOG_REQUIRE_EXTENSIONS=1), and
# is skipped, saying why, only where it could not.
from __future__ import annotations

import importlib
import os
import shutil

import pytest

REQUIRE_ENV = "RIVERLOG_REQUIRE_EXTENSIONS"
IMPLEMENTATIONS = ("python", "compiled")


def compiled_or_skip(name: str):
    """The compiled module ``name`` (e.g. "riverlog._record_c"); pytest.fail when missing and
    buildable here, pytest.skip when missing for want of a C compiler."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        why = (f"{name} is not built ({exc}): run `pip install -e .` (or "
               f"`python setup.py build_ext --inplace`)")
        if os.environ.get(REQUIRE_ENV, "") not in ("", "0") or shutil.which("cc"):
            pytest.fail(f"{why}; a C compiler is here, so it should have been")
        pytest.skip(f"{why}; no C compiler (cc) on PATH")


def implementation(param: str, python: tuple, reference, compiled: str,
                   names: tuple[str, ...]) -> tuple:
    """For a fixture parametrized over IMPLEMENTATIONS: ``python`` (the reference objects) for
    "python", else the attributes ``names`` (in the same order) of the twin ``compiled``,
    bound to the Python module ``reference`` (its ``_bind_twin``, which RIVERLOG_NO_EXTENSIONS
    would have skipped)."""
    if param == "python":
        return python
    twin = compiled_or_skip(compiled)
    reference._bind_twin(twin)
    return tuple(getattr(twin, name) for name in names)
