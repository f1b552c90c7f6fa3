"""The command table: every entry's runner is a function that takes an Invocation; a runner is
imported only when its command runs; a new command is one table entry and one runner module (a toy
command registered here runs through cli.main with the shared arguments); sub-verbs keep their
names; the image reference is read one way."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from builder import cli
from builder.commands.table import COMMANDS, COMPOSED, IMAGE, TREE, Command, flag
from builder.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]

TOY_RUNNER = '''
def hello(inv):
    print(f"hello {inv.image_name()} root={inv.root} config={inv.config} sets={inv.sets} loud={inv.args.loud}")
    return 3
'''


def test_every_runner_is_a_function_of_one_invocation() -> None:
    names = [c.name for c in COMMANDS]
    assert len(names) == len(set(names))
    for cmd in COMMANDS:
        module, _, function = cmd.runner.partition(":")
        run = getattr(importlib.import_module(module), function)
        assert list(inspect.signature(run).parameters) == ["inv"], cmd.name


def test_runners_are_imported_only_when_their_command_runs() -> None:
    code = ("import sys; from builder import cli; cli.parser(); "
            "print(sorted(m for m in sys.modules if m.startswith(('builder.commands.', 'builder.pipeline', "
            "'builder.compose', 'docker'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['builder.commands.invocation', 'builder.commands.table']"


def test_a_new_command_is_a_table_entry_and_a_runner_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "toy_runner.py").write_text(TOY_RUNNER)
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = Command("hello", "greet an image", "toy", "toy_runner:hello",
                  (IMAGE, *COMPOSED, flag("--loud", "say it louder")), frozenset({TREE}))
    rc = cli.main(["hello", f"{ROOT}/images/container-base.yaml", "--loud"], commands=(*COMMANDS, toy))
    assert rc == 3  # the runner's exit code is the command's
    out = capsys.readouterr().out
    assert out == f"hello container-base root={ROOT} config=None sets=[] loud=True\n"  # the root from the image path


def test_an_unknown_image_is_one_error_for_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--root", str(ROOT), "lock", "no-such-image"]) == 2
    assert "no-such-image: no such image" in capsys.readouterr().err


def test_sub_verbs_keep_their_names_and_arguments() -> None:
    p = cli.parser()
    args = p.parse_args(["export", "oci", "cuda-base", "out", "-c", "site"])
    assert (args.run.name, args.format, args.image, args.dir, args.config) == ("export oci", "oci", "cuda-base",
                                                                               "out", "site")
    args = p.parse_args(["import", "oci", "out", "-r", "localhost:5000"])
    assert (args.run.name, args.registry, args.repository) == ("import oci", "localhost:5000", None)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["export"])
    assert e.value.code == 2


def test_a_push_without_a_registry_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from builder import publish
    from builder.definitions.load import load_tree

    with pytest.raises(UsageError, match="no registry"):
        publish.registry_for(load_tree(ROOT), None, None)
    assert publish.registry_for(load_tree(ROOT), None, "localhost:5000") == "localhost:5000"
