"""`nodeforge matrix`: the variants of images × configs, composed as a build composes them, folded
where a config leaves the image as it is, with the step keys more than one variant builds; engine-free."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from builder import cli
from builder.compose.image import compose
from builder.compose.variants import chain, steps_of
from builder.definitions.load import load_tree

ROOT = Path(__file__).resolve().parents[2]


def run_matrix(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert cli.main(["--root", str(ROOT), "matrix", *args]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_every_config_by_default_and_a_config_that_changes_nothing_folds(capsys: pytest.CaptureFixture[str]) -> None:
    tree = load_tree(ROOT)
    doc = run_matrix(capsys, "gpu-node")
    names = [v["name"] for v in doc["variants"]]
    assert names == ["gpu-node", *(f"gpu-node@{c}" for c in sorted(tree.configs) if c != "default")]
    plain = doc["variants"][0]
    assert plain["same_as"] == ["default"]  # default keeps gpu-node's key: built once, under the plain tags
    assert plain["key"] == compose(tree, "gpu-node", "default").key == compose(tree, "gpu-node").key
    for v in doc["variants"]:
        p = compose(tree, v["image"], v["config"])
        assert (v["key"], v["tags"]) == (p.key, list(p.tags))
    assert len({(v["key"], tuple(v["tags"])) for v in doc["variants"]}) == len(names)  # no build twice


def test_the_shared_keys_are_those_more_than_one_variant_builds(capsys: pytest.CaptureFixture[str]) -> None:
    tree = load_tree(ROOT)
    doc = run_matrix(capsys, "cuda-13.0-base", "images/cuda-13.0-runtime.yaml", "-c", "default")
    base, runtime = doc["variants"]
    memo: dict[Any, Any] = {}
    keys = {v["name"]: [s.key for s in steps_of(chain(tree, compose(tree, v["image"], "default"), "default", [],
                                                       memo))] for v in doc["variants"]}
    assert (base["steps"], runtime["steps"]) == (len(keys[base["name"]]), len(keys[runtime["name"]]))
    # the runtime builds on the base, which builds on container-base: every step of the base is shared
    assert [s["key"] for s in doc["shared"]] == keys[base["name"]]
    assert all(s["variants"] == [base["name"], runtime["name"]] for s in doc["shared"])
    assert doc["shared"][0]["step"] == "bootstrap" and doc["shared"][0]["image"] == "container-base"
    assert doc["distinct_keys"] == len(set(keys[base["name"]]) | set(keys[runtime["name"]]))
    assert doc["step_builds_unshared"] == base["steps"] + runtime["steps"]


def test_each_variant_carries_the_command_that_builds_it(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_matrix(capsys, "node-minimal", "-c", "dgx-h100", "-c", "configs/v100-slurm.yaml",
                     "--set", "sysctl.swappiness=3")
    assert [v["config"] for v in doc["variants"]] == ["dgx-h100", "v100-slurm"]
    for v in doc["variants"]:
        words = shlex.split(v["command"])
        assert words[0] == "nodeforge"
        args = cli.parser().parse_args(["--root", str(ROOT), *words[1:]])
        assert (args.run.name, args.images, args.config, args.set) == ("build", ["images/node-minimal.yaml"],
                                                                      v["config"], ["sysctl.swappiness=3"])
        assert v["sets"] == ["sysctl.swappiness=3"]


def test_an_unknown_config_or_image_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--root", str(ROOT), "matrix", "node-minimal", "-c", "nope"]) == 2
    assert "nope: no such config" in capsys.readouterr().err
    assert cli.main(["--root", str(ROOT), "matrix", "no-such-image"]) == 2
    assert "no-such-image: no such image" in capsys.readouterr().err


def test_a_variant_whose_lock_pins_too_little_takes_the_resolution_a_build_kept(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from builder import lockfile
    from builder.compose.variants import variants

    tree_dir = tmp_path / "tree"
    shutil.copytree(ROOT / "tests" / "fixtures" / "keys-tree", tree_dir)
    monkeypatch.setenv("NODEFORGE_BUILD_DIR", str(tmp_path / "build"))
    kept = lockfile.resolved_path(tree_dir, "container-base")
    kept.parent.mkdir(parents=True)
    (tree_dir / "images" / "container-base.lock").rename(kept)  # as a build leaves it: no lock file, a resolution
    tree = load_tree(tree_dir)
    (v,) = variants(tree, ["container-base"], [None], [])
    as_built = compose(tree, "container-base", locks=lockfile.kept_resolutions(tree_dir))
    assert v.plan.key == as_built.key != compose(tree, "container-base").key
    assert v.to_json()["pinned"] is True
