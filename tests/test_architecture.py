"""The shape of the package, checked with `ast` (no engine, nothing imported).

Stages are ranked top to bottom; a module may import from its own stage or from stages below it,
never from a stage above or beside it, and the import graph (function-level imports included)
has no cycle. A synthetic package shows that the check fires.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "builder"

# top to bottom; each entry is one rank, a set of stages that may not import one another
RANKS: list[set[str]] = [
    {"__main__"},
    {"cli"},
    {"commands"},  # the command table and its runners: every stage below is reachable from here
    {"repro"},  # the reproducibility comparison: builds twice, compares (OCI layouts from export)
    {"export"},
    {"pipeline", "verify", "publish", "diff", "done", "slurm"},
    {"manifest", "mirror"},
    {"node"},
    {"engine"},
    {"fleetcache"},  # the fleet cache: registry entries and their signatures (the engine's steps use it)
    {"compose"},
    {"checks"},
    {"definitions"},
    {"lockfile"},
    {"plan", "debian", "progress", "resources"},
    {"paths"},
    {"errors"},
    {"escaping", "debversion"},
]


def module_name(package: Path, path: Path) -> str:
    parts = list(path.relative_to(package).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(current: str, is_package: bool, node: ast.ImportFrom, root: str) -> list[str]:
    """The modules of the package that an import names (relative or absolute)."""
    if node.level == 0:
        if not node.module or not (node.module == root or node.module.startswith(root + ".")):
            return []
        base = node.module.removeprefix(root).lstrip(".")
    else:
        parts = current.split(".") if current else []
        if not is_package:
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
        base = ".".join([*parts, *(node.module.split(".") if node.module else [])])
    names = [f"{base}.{a.name}".lstrip(".") for a in node.names]  # a name may be a submodule
    return [base, *names] if node.module else names


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports, at any depth of the code."""
    root = package.name
    paths = {module_name(package, p): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for mod, path in paths.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                targets = _resolve(mod, path.name == "__init__.py", node, root)
            elif isinstance(node, ast.Import):
                targets = [a.name.removeprefix(root + ".") for a in node.names if a.name.startswith(root + ".")]
            for t in targets:
                while t and t not in paths:  # `from .x import name`: name is not a module
                    t = t.rpartition(".")[0]
                if t != mod and t:
                    graph[mod].add(t)
    return graph


def stage(module: str) -> str:
    return module.split(".")[0]


def rank_of(module: str, ranks: list[set[str]]) -> int:
    for i, r in enumerate(ranks):
        if stage(module) in r:
            return i
    raise KeyError(f"module {module!r} is in no rank: add its stage to RANKS")


def upward_edges(graph: dict[str, set[str]], ranks: list[set[str]]) -> list[str]:
    """Every import that points up the ranks or sideways to another stage of the same rank."""
    bad = []
    for a, targets in sorted(graph.items()):
        if not a:  # the package's own __init__
            continue
        for b in sorted(targets):
            if not b or stage(a) == stage(b):
                continue
            if rank_of(b, ranks) <= rank_of(a, ranks):
                bad.append(f"{a} -> {b}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_rank() -> None:
    for m in import_graph(PACKAGE):
        if m:
            rank_of(m, RANKS)


def test_imports_point_down_the_stages() -> None:
    assert upward_edges(import_graph(PACKAGE), RANKS) == []


def test_no_import_cycle() -> None:
    assert cycles(import_graph(PACKAGE)) == []


MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400


def oversized(package: Path) -> list[str]:
    """Every function over MAX_FUNCTION_LINES lines (a nested one counts on its own) and every
    module over MAX_MODULE_LINES lines."""
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(package)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_function_over_80_lines_and_no_module_over_400() -> None:
    assert oversized(PACKAGE) == []


def test_size_check_fires_on_a_long_function_and_a_long_module(tmp_path: Path) -> None:
    pkg = tmp_path / "synth"
    pkg.mkdir()
    (pkg / "ok.py").write_text("def f() -> int:\n" + "    x = 1\n" * 78 + "    return x\n")
    assert oversized(pkg) == []
    (pkg / "long.py").write_text("def g() -> int:\n" + "    x = 1\n" * 79 + "    return x\n")
    (pkg / "big.py").write_text("x = 1\n" * 401)
    assert oversized(pkg) == ["big.py: 401 lines", "long.py:1 g: 81 lines"]


# --- the checker itself, on a small synthetic package ---------------------------------------------

SYNTH_RANKS = [{"top"}, {"middle", "side"}, {"low"}]


def _synthetic(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "synth"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


GOOD = {
    "top.py": "from .middle import m\n",
    "middle/__init__.py": "",
    "middle/m.py": "from ..low import x\nfrom . import n\n",
    "middle/n.py": "import synth.low\n",
    "side.py": "from .low import x\n",
    "low.py": "x = 1\n",
}


def test_checker_accepts_a_package_whose_imports_point_down(tmp_path: Path) -> None:
    graph = import_graph(_synthetic(tmp_path, GOOD))
    assert graph["middle.m"] == {"low", "middle.n"}
    assert graph["middle.n"] == {"low"}
    assert upward_edges(graph, SYNTH_RANKS) == []
    assert cycles(graph) == []


def test_checker_reports_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    files = {**GOOD, "low.py": "x = 1\n\n\ndef f():\n    from .middle.m import y\n    return y\n"}
    graph = import_graph(_synthetic(tmp_path, files))
    assert upward_edges(graph, SYNTH_RANKS) == ["low -> middle.m"]
    assert cycles(graph) == [["low", "middle.m", "middle.n"]]


def test_checker_reports_a_sideways_import(tmp_path: Path) -> None:
    files = {**GOOD, "side.py": "from .middle import m\n"}
    assert upward_edges(import_graph(_synthetic(tmp_path, files)), SYNTH_RANKS) == ["side -> middle",
                                                                                   "side -> middle.m"]


def test_checker_reports_a_module_outside_the_ranks(tmp_path: Path) -> None:
    graph = import_graph(_synthetic(tmp_path, {**GOOD, "stray.py": "from .low import x\n"}))
    with pytest.raises(KeyError, match="stray"):
        upward_edges(graph, SYNTH_RANKS)


# --- packaging: a non-editable install carries every subpackage and the resources -----------------

def test_wheel_install_carries_every_module(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(PACKAGE, src / "builder", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(PACKAGE.parent / name, src / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("nodeforge-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, capture_output=True)
    wanted = sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts)
    installed = sorted(str(p.relative_to(site)) for p in (site / "builder").rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts)
    assert installed == wanted
    modules = sorted(f"builder.{m}" if m else "builder" for m in import_graph(PACKAGE) if m != "__main__")
    probe = ("import importlib, sys\n"
             f"for m in {modules!r}:\n"
             "    mod = importlib.import_module(m)\n"
             f"    assert mod.__file__.startswith({str(site)!r}), mod.__file__\n")
    subprocess.run([sys.executable, "-c", probe], check=True, env={**os.environ, "PYTHONPATH": str(site)},
                   cwd=tmp_path)
