"""The size rules (functions <= 80 lines, modules <= 400) hold for the Python that layers ship too:
every .py file under layers/*/files and every extension-less file there whose first line is a
python shebang (nodeforge-gpu-power, nodeforge-gpu-metrics, ...)."""

from __future__ import annotations

from pathlib import Path

from support.sizes import is_python, oversized

ROOT = Path(__file__).resolve().parent.parent


def layer_programs(root: Path) -> list[Path]:
    return [p for p in sorted(root.glob("layers/*/files/**/*")) if p.is_file() and is_python(p)]


def test_layer_programs_are_found() -> None:
    names = {p.name for p in layer_programs(ROOT)}
    assert {"gpu-health.py", "nodeforge-gpu-power", "nodeforge-gpu-metrics", "nodeforge_node.py"} <= names
    assert "nvidia-gpu-present" not in names  # a shell script


def test_no_layer_program_function_over_80_lines_and_no_module_over_400() -> None:
    assert oversized(layer_programs(ROOT), ROOT) == []


def test_size_check_fires_on_an_extension_less_program(tmp_path: Path) -> None:
    files = tmp_path / "layers/x/files"
    files.mkdir(parents=True)
    (files / "ok").write_text("#!/usr/bin/python3\ndef f() -> int:\n" + "    x = 1\n" * 78 + "    return x\n")
    (files / "run.sh").write_text("#!/bin/sh\n" + "true\n" * 500)
    (files / "notes").write_text("x\n" * 500)
    assert oversized(layer_programs(tmp_path), tmp_path) == []
    (files / "long").write_text("#!/usr/bin/env python3\ndef g() -> int:\n" + "    x = 1\n" * 79 + "    return x\n")
    (files / "big.py").write_text("x = 1\n" * 401)
    assert oversized(layer_programs(tmp_path), tmp_path) == [
        "layers/x/files/big.py: 401 lines", "layers/x/files/long:2 g: 81 lines"]
