"""Commands that judge a built image judge the image that was built (nodeforge issue 14).

A build records its config and --set values on the image (io.nodeforge.config, io.nodeforge.sets,
next to io.nodeforge.key). `test` (and boot, push, export) compare the plan their flags compose
with the image's key: without flags they recompose the recorded plan; with other flags they refuse
(exit 2) naming both keys and the flags that match. Never a silent mismatch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
import pytest
from support.trees import scratch_image

from builder.compose import compose
from builder.compose.params import parse_sets
from builder.definitions.load import load_tree
from builder.engine.recorded import built_plan, recorded
from builder.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
IMAGE = scratch_image("newcomer", "a small container image for the recorded-build tests", ["probe"], kind="container",
                      version="1.0", tag="nodeforge-test/newcomer:1.0")
LAYER = """\
name: probe
summary: writes one value into a file
params:
  value: {type: str, default: default-value, doc: what the file holds}
  extra: {type: "list[str]", default: [], doc: more lines}
files:
  - path: /etc/probe.conf
    content: "{{ value }}{% for e in extra %} {{ e }}{% endfor %}\\n"
tests:
  - name: the file holds the value
    file: {path: /etc/probe.conf, content: {contains: ["{{ value }}"]}}
"""
CONFIG = "name: site\nsummary: a site\nparams:\n  probe: {value: site-value}\n"


def make_tree(root: Path) -> Path:
    (root / "layers/probe").mkdir(parents=True)
    (root / "layers/probe/layer.yaml").write_text(LAYER)
    (root / "images").mkdir()
    (root / "images/newcomer.yaml").write_text(IMAGE)
    (root / "configs").mkdir()
    (root / "configs/site.yaml").write_text(CONFIG)
    return root


def labels_for(plan_config: str | None, sets: list[str], root: Path) -> dict[str, str]:
    """The labels a build with these flags records (as engine.labels writes them)."""
    plan = compose(load_tree(root), "newcomer", plan_config, parse_sets(sets))
    return {"io.nodeforge.key": plan.key, "io.nodeforge.config": plan_config or "",
            "io.nodeforge.sets": json.dumps(list(plan.sets))}


def test_flags_matching_the_built_image_give_its_plan(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    labels = labels_for(None, ["probe.value=built"], root)
    plan, config, sets = built_plan(load_tree(root), "newcomer", None, parse_sets(["probe.value=built"]), "test",
                                    lambda ref: labels)
    assert plan.key == labels["io.nodeforge.key"] and config is None and sets == parse_sets(["probe.value=built"])


def test_no_flags_recompose_the_recorded_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_tree(tmp_path)
    labels = labels_for("site", ["probe.value=built", "probe.extra+=[x]"], root)
    plan, config, sets = built_plan(load_tree(root), "newcomer", None, [], "test", lambda ref: labels)
    assert plan.key == labels["io.nodeforge.key"] and len(sets) == 2
    assert config == "site" and plan.params["probe.value"].value == "built"
    assert plan.params["probe.extra"].value == ["x"]
    assert "was built with -c site --set" in capsys.readouterr().err


def test_other_flags_are_refused_naming_both_keys_and_the_matching_flags(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    labels = labels_for(None, ["probe.value=built"], root)
    tree = load_tree(root)
    for config, sets in ((None, ["probe.value=other"]), ("site", [])):
        mine = compose(tree, "newcomer", config, parse_sets(sets))
        with pytest.raises(UsageError) as e:
            built_plan(tree, "newcomer", config, parse_sets(sets), "test", lambda ref: labels)
        text = str(e.value)
        assert labels["io.nodeforge.key"][:12] in text and mine.key[:12] in text
        assert "nodeforge test newcomer --set 'probe.value=\"built\"'" in text
        assert "nodeforge build images/newcomer.yaml" in text
        assert e.value.exit_code == 2


def test_an_out_of_date_image_is_refused_without_flags(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    labels = labels_for(None, ["probe.value=built"], root)
    (root / "layers/probe/layer.yaml").write_text(LAYER.replace("/etc/probe.conf\n", "/etc/probe2.conf\n", 1))
    with pytest.raises(UsageError) as e:
        built_plan(load_tree(root), "newcomer", None, [], "test", lambda ref: labels)
    assert "out of date" in str(e.value) and "nodeforge build images/newcomer.yaml --set" in str(e.value)


def test_unbuilt_or_unlabelled_images_use_the_flags(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    tree = load_tree(root)
    want = compose(tree, "newcomer", "site").key
    assert built_plan(tree, "newcomer", "site", [], "test", lambda ref: None)[0].key == want
    assert built_plan(tree, "newcomer", "site", [], "test", lambda ref: {"other": "x"})[0].key == want
    assert recorded({"io.nodeforge.key": "k", "io.nodeforge.sets": "not json"}) is not None


def nodeforge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=1800)


def test_build_with_set_then_test_without_it(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    """The issue's case end to end: build with --set, then test without it (the recorded plan, a
    pass, and the report's key is the image's), with other flags (a refusal, exit 2), with the same
    flags (a pass)."""
    root = make_tree(tmp_path / "tree")
    image = str(root / "images/newcomer.yaml")
    built = nodeforge("build", image, "--set", "probe.value=built-value", "-q")
    assert built.returncode == 0, built.stderr
    labels: dict[str, Any] = docker_client.api.inspect_image("nodeforge-test/newcomer:1.0")["Config"]["Labels"]
    assert json.loads(labels["io.nodeforge.sets"]) == ['probe.value="built-value"']
    report = tmp_path / "reports"

    plain = nodeforge("test", image, "--report", str(report))
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "was built with --set" in plain.stderr
    assert json.loads((report / "newcomer.json").read_text())["key"] == labels["io.nodeforge.key"]

    other = nodeforge("test", image, "--set", "probe.value=other", "--report", str(report))
    assert other.returncode == 2, other.stdout + other.stderr
    assert labels["io.nodeforge.key"][:12] in other.stderr and "probe.value" in other.stderr

    with_config = nodeforge("test", image, "-c", "site", "--report", str(report))
    assert with_config.returncode == 2 and "-c site" in with_config.stderr

    same = nodeforge("test", image, "--set", "probe.value=built-value", "--report", str(report))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "was built with" not in same.stderr


def test_diff_headers_say_what_each_image_was_built_from() -> None:
    from builder.diff import _built_from

    labels = {"io.nodeforge.key": "abcdef1234567890", "io.nodeforge.config": "site",
              "io.nodeforge.sets": json.dumps(['probe.value="x y"'])}
    assert _built_from(labels) == "; plan abcdef123456, built with -c site --set 'probe.value=\"x y\"'"
    assert _built_from({"io.nodeforge.key": "abcdef1234567890"}) == "; plan abcdef123456"
    assert _built_from({}) == ""
