"""No test module imports another test module: what tests share lives in tests/support (tests/ is on
sys.path, so `from support.offline import ...`), and no test puts a folder on sys.path to borrow from
a test module."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def python_files() -> list[Path]:
    """Every Python file of the suite: test modules, conftest and support (not the fixture trees)."""
    return sorted(p for p in TESTS.rglob("*.py") if "fixtures" not in p.relative_to(TESTS).parts)


def module_names() -> set[str]:
    """The import names a test module could be reached by: test_x, unit.test_x, tests.unit.test_x."""
    names = set()
    for p in python_files():
        if p.name.startswith("test_") or p.name == "conftest.py":
            parts = p.relative_to(TESTS).with_suffix("").parts
            names |= {".".join(parts[i:]) for i in range(len(parts))} | {".".join(("tests", *parts))}
    return names


def imported(text: str, package: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in a file's text, at any depth, relative ones resolved to its
    package (its folder under tests/)."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            yield node.lineno, module
            yield from ((node.lineno, f"{module}.{a.name}".strip(".")) for a in node.names)


def borrowed(text: str, package: tuple[str, ...], modules: set[str], test_module: bool) -> list[str]:
    """What a file borrows from test modules: imports of them, and (in a test module or conftest;
    support may load a node program from its folder) folders put on sys.path."""
    found = [f"{line}: imports test module {name}" for line, name in imported(text, package) if name in modules]
    if test_module:
        found += [f"{node.lineno}: puts a folder on sys.path" for node in ast.walk(ast.parse(text))
                  if isinstance(node, ast.Attribute) and node.attr in ("insert", "append")
                  and ast.unparse(node.value) == "sys.path"]
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def test_no_test_module_imports_another() -> None:
    modules = module_names()
    problems = [f"{f.relative_to(TESTS.parent)}:{p}" for f in python_files()
                for p in borrowed(f.read_text(encoding="utf-8"), f.parent.relative_to(TESTS).parts, modules,
                                  f.parent.name != "support")]
    assert problems == [], "move what tests share into tests/support:\n" + "\n".join(problems)


def test_the_check_finds_a_borrowed_helper() -> None:
    """The check itself: a module importing test_gpu_node's helpers, absolutely and relatively, and
    one putting tests/ on sys.path are found; importing support is fine."""
    modules = module_names()
    source = ("import sys\nsys.path.insert(0, 'tests')\nfrom test_gpu_node import offline_sets\n"
              "from . import test_cli\nfrom support.offline import serve\n")
    assert borrowed(source, ("unit",), modules, True) == [
        "2: puts a folder on sys.path", "3: imports test module test_gpu_node", "4: imports test module unit.test_cli"]
