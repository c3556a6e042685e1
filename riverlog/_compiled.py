# riverlog._compiled: which per-message codecs run compiled (Cython) and which in Python.
#
# What it owns: importing the compiled twins (`_name_c` beside `name.py`, built by setup.py's
# optional build_ext), the switch that turns them off, and the one line `riverlog serve` logs
# about them. Nothing here knows what a twin computes.
# Rules:
# - The Python module is the reference and the fallback: it calls ``twin(__name__, "_name_c")``
#   once at import and, when that returns a module, binds the compiled functions over its own
#   public names (keeping the Python ones as ``_py_*``). A twin that is missing or fails to
#   import is never an error: the Python code runs, and ``status()`` says why.
# - RIVERLOG_NO_EXTENSIONS=1 (any value but "", "0") forces the pure-Python path at import,
#   as AIOHTTP_NO_EXTENSIONS does for aiohttp. It is read once, at each module's import.
from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Optional

__all__ = ["NO_EXTENSIONS_ENV", "disabled", "status", "twin"]

NO_EXTENSIONS_ENV = "RIVERLOG_NO_EXTENSIONS"
"""Environment variable: set to 1 to run every codec in pure Python."""

_loaded: dict[str, bool] = {}  # twin module name -> loaded
_reasons: dict[str, str] = {}  # twin module name -> why not


def disabled() -> bool:
    """Whether RIVERLOG_NO_EXTENSIONS asks for the pure-Python codecs."""
    return os.environ.get(NO_EXTENSIONS_ENV, "") not in ("", "0")


def twin(module: str, name: str) -> Optional[ModuleType]:
    """The compiled twin ``name`` of the Python module ``module`` (its ``__name__``), e.g.
    ``twin(__name__, "_envelope_c")``, or None (switched off, not built, or broken; the
    reason is kept for ``status()``). Never raises."""
    full = module.rpartition(".")[0] + "." + name
    if disabled():
        _loaded[full] = False
        _reasons[full] = f"{NO_EXTENSIONS_ENV} is set"
        return None
    try:
        compiled = importlib.import_module(full)
    except Exception as exc:  # ImportError when not built; anything else is a broken build
        _loaded[full] = False
        if isinstance(exc, ModuleNotFoundError) and exc.name == full:
            _reasons[full] = f"{name} not built"
        else:
            _reasons[full] = f"{full}: {type(exc).__name__}: {exc}"
        return None
    _loaded[full] = True
    return compiled


def status() -> str:
    """One line on the codecs imported so far: "compiled (Cython): <twins>", "pure Python
    (no compiled extensions: <reason>)", or "mixed" with both lists."""
    compiled = sorted(n.rpartition(".")[2] for n, ok in _loaded.items() if ok)
    missing = sorted(n for n, ok in _loaded.items() if not ok)
    if not _loaded:
        return "pure Python (no compiled codec imported)"
    if not missing:
        return f"compiled (Cython): {', '.join(compiled)}"
    reasons = sorted(set(_reasons[n] for n in missing))
    if not compiled:
        return f"pure Python (no compiled extensions: {'; '.join(reasons)})"
    return (f"mixed: compiled (Cython) {', '.join(compiled)}; pure Python for "
            f"{', '.join(n.rpartition('.')[2] for n in missing)} ({'; '.join(reasons)})")
