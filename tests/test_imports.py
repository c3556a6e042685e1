# The package's house rules that a run can check (issue 22 items 2 and 3): every module of
# riverlog imports on its own, in an interpreter where nothing of riverlog was imported before
# (so no module works only because another one happened to be imported first), `python -m
# riverlog` starts, and no two modules import each other, directly or through others (an
# import circle), counting every import statement at any depth, absolute or relative, as
# /work/shared/tools/house_check.py does.
import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "riverlog"

# One interpreter, one fork per module (as many at once as there are cores): the parent imports nothing of riverlog (only the
# third-party libraries riverlog's modules name, argv before "--", so each child does not pay
# for them again), each child imports one module and exits; a failure is reported as
# "module: error" on stdout.
_IMPORT_EACH = r"""
import importlib, os, sys, traceback
split = sys.argv.index("--")
for library in sys.argv[1:split]:
    try:
        importlib.import_module(library)
    except Exception:  # optional ones; a riverlog module needing it reports it below
        pass
assert not any(m == "riverlog" or m.startswith("riverlog.") for m in sys.modules)
failed = running = 0
for name in sys.argv[split + 1:]:
    if running == (os.cpu_count() or 1):
        failed += os.wait()[1] != 0
        running -= 1
    sys.stdout.flush()
    if os.fork() == 0:
        try:
            __import__(name)
        except BaseException:
            line = traceback.format_exc().strip().splitlines()[-1]
            print(f"{name}: {line}", flush=True)
            os._exit(1)
        os._exit(0)
    running += 1
for _ in range(running):
    failed += os.wait()[1] != 0
sys.exit(1 if failed else 0)
"""


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (packages by their __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _libraries(modules: dict[str, Path]) -> list[str]:
    """The top-level names of what riverlog's modules import that is not riverlog."""
    found = set()
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module)
    return sorted(n for n in found if n.split(".")[0] != "riverlog")


def test_every_module_imports_on_its_own():
    modules = _modules()
    names = [n for n in modules if n != "riverlog.__main__"]  # that one runs the CLI
    assert len(names) > 50
    done = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *_libraries(modules), "--",
                           *names], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, "modules that do not import on their own:\n" + done.stdout \
        + done.stderr[-2000:]


def test_python_m_riverlog_starts():
    done = subprocess.run([sys.executable, "-m", "riverlog", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "serve" in done.stdout


def _imported(name: str, path: Path, modules: dict[str, Path], node: ast.AST) -> list[str]:
    """The modules of the package an import statement in module ``name`` names."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        if node.level:
            base = name.split(".")
            if path.name != "__init__.py":
                base.pop()  # a module's package
            base = base[:len(base) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix
                   for a in node.names]
    found = []
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.append(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (a package importing its own
    submodules to re-export them is left out: that is no circle of concepts)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_imported(name, path, modules, node))
        graph[name] = {t for t in edges if not t.startswith(name + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_cycle_check_finds_a_circle():
    # the check itself: a -> b -> c -> a is one circle, d -> a and a package importing its
    # own submodule are none
    assert cycles({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}) \
        == [["p.a", "p.b", "p.c"]]
    assert cycles({"p": {"p.a"}, "p.a": set()}) == []
    modules = {"riverlog.x": Path("x.py"), "riverlog.y": Path("y.py"),
               "riverlog.pkg": Path("pkg/__init__.py"), "riverlog.pkg.z": Path("pkg/z.py")}
    tree = ast.parse("from .y import f\nfrom .pkg import z\nimport riverlog.pkg.z\n"
                     "def g():\n    from . import y\n")
    found = [t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
             for t in _imported("riverlog.x", Path("x.py"), modules, node)]
    assert sorted(found) == ["riverlog.pkg.z", "riverlog.pkg.z", "riverlog.y", "riverlog.y"]


def test_no_import_circles():
    graph = import_graph()
    assert "riverlog.log.commitlog" in graph and graph["riverlog.log.commitlog"]
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


if __name__ == "__main__":  # a quick look: python tests/test_imports.py
    for circle in cycles(import_graph()):
        print("circle:", " ".join(circle))
    print(os.linesep.join(f"{n}: {len(e)}" for n, e in sorted(import_graph().items())))
