"""The project's size rules, measured the same way for the package and for the programs layers ship:
no function over MAX_FUNCTION_LINES lines (a nested one counts on its own), no module over
MAX_MODULE_LINES lines. tests/test_architecture.py keeps its own copy for builder/ (another owner);
tests/test_program_sizes.py uses this one for layers/*/files."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400


def is_python(path: Path) -> bool:
    """A .py file, or an extension-less program whose first line is a python3 shebang."""
    if path.suffix == ".py":
        return True
    if path.suffix or not path.is_file():
        return False
    with open(path, "rb") as fh:
        first = fh.readline()
    return first.startswith(b"#!") and b"python" in first


def oversized(paths: Iterable[Path], root: Path) -> list[str]:
    """'file: N lines' for each module over the limit, 'file:LINE name: N lines' for each function."""
    found = []
    for path in sorted(paths):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root)
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{rel}: {lines} lines")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    return found
