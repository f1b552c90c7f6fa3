"""The README as a newcomer reads it: the "Your first layer" walk-through runs as written (its files
written into a copy of the project, its commands run in order), and the command list shows every
flag each command takes (checked against the argument parser) and is the one the command table
generates."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import docker

from builder.cli import parser
from builder.commands.table import readme_block

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCK = re.compile(r"<!-- first-layer: (file (\S+)|run) -->\n```\w*\n(.*?)```", re.S)


def walkthrough() -> tuple[dict[str, str], list[list[str]]]:
    files: dict[str, str] = {}
    commands: list[list[str]] = []
    for m in BLOCK.finditer(README):
        if m.group(2):
            files[m.group(2)] = m.group(3)
        else:
            commands += [shlex.split(line) for line in m.group(3).splitlines() if line.strip()]
    return files, commands


def project_copy(tmp: Path) -> Path:
    for d in ("layers", "images", "configs"):
        shutil.copytree(ROOT / d, tmp / d)
    files, _ = walkthrough()
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return tmp


def run(tree: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "nodeforge"
    return subprocess.run([sys.executable, "-m", "builder", *argv[1:]], cwd=tree, capture_output=True, text=True,
                          timeout=3000)


def test_the_walkthrough_has_its_files_and_commands() -> None:
    files, commands = walkthrough()
    assert set(files) == {"layers/timesync/layer.yaml", "images/timesync-container.yaml",
                          "images/timesync-node.yaml"}
    assert [c[1] for c in commands] == ["validate", "plan", "plan", "build", "test"]


def test_the_walkthrough_validates_and_plans_the_unit_for_the_node_only(tmp_path: Path) -> None:
    tree = project_copy(tmp_path)
    _, commands = walkthrough()
    outputs = {}
    for argv in commands:
        if argv[1] in ("validate", "plan"):
            done = run(tree, argv)
            assert done.returncode == 0, f"{shlex.join(argv)}\n{done.stdout}{done.stderr}"
            outputs[argv[2] if len(argv) > 2 else argv[1]] = done.stdout
    assert "systemd-timesyncd.service" in outputs["images/timesync-node.yaml"]
    assert "systemd-timesyncd.service" not in outputs["images/timesync-container.yaml"]
    assert "ntp1.example.org" in outputs["images/timesync-node.yaml"]


def test_the_walkthrough_runs_end_to_end(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    tree = project_copy(tmp_path)
    _, commands = walkthrough()
    for argv in commands:
        done = run(tree, argv)
        assert done.returncode == 0, f"{shlex.join(argv)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    labels = docker_client.api.inspect_image("nodeforge-example/timesync-container:0.1.0")["Config"]["Labels"]
    assert "ntp1.example.org" in labels["io.nodeforge.sets"]


def _subparsers(p: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    out: dict[str, argparse.ArgumentParser] = {}
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                inner = _subparsers(sp, f"{prefix}{name} ")
                out.update(inner or {f"{prefix}{name}": sp})
    return out


def command_list() -> dict[str, str]:
    """README command-list text per command: its line and the indented lines after it."""
    block = README.split("## Command line", 1)[1].split("```", 2)[1]
    out: dict[str, str] = {}
    current = ""
    for line in block.splitlines():
        if line.startswith("nodeforge "):
            words = line.split()
            current = " ".join(words[1:3]) if words[1] in ("export", "import") else words[1]
            out[current] = line
        elif current:
            out[current] += "\n" + line
    return out


def test_the_command_list_shows_every_flag_of_every_command() -> None:
    documented = command_list()
    commands = _subparsers(parser())
    assert set(documented) == set(commands)
    missing = []
    for name, sp in commands.items():
        for action in sp._actions:
            if not action.option_strings or "-h" in action.option_strings:
                continue
            if not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", documented[name])
                       for o in action.option_strings):
                missing.append(f"{name}: {'/'.join(action.option_strings)}")
    assert missing == []


def test_the_flag_check_fires_on_a_missing_flag() -> None:
    documented = command_list()
    assert "--locked" in documented["build"]
    assert not re.search(r"(?<![\w-])--unknown-flag(?![\w-])", documented["build"])


def test_the_command_list_is_generated_from_the_command_table() -> None:
    block = README.split("## Command line", 1)[1].split("```", 2)[1]
    assert block.lstrip("\n") == readme_block(), ("README's command list differs from the command table; "
                                                  "paste builder.commands.table.readme_block() into it")
