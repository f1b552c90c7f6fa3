"""The manifest diff as the one document a change board reads (issue 28, item 4): a small image
built twice with one value changed in a site layer. Its diff names the layer (key old -> new), the
parameter with where it was set, and the changed file with its changed line; `diff_previous` gives
the same from the kept history, without a copy made by hand."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import docker
import pytest
from support.trees import scratch_image

from builder import diff
from builder.compose import compose
from builder.compose.image import output_name
from builder.definitions.load import load_tree
from builder.manifest import history
from builder.pipeline import Builder, BuildResult
from builder.progress import Progress

IMAGE = scratch_image("rv", "a small container image for the review diff test", ["site"], kind="container",
                      version="1.0", tag="nodeforge-test/rv:1.0")
SITE = """name: site
summary: the site's time server
applies-to: [container]
params:
  server: {type: str, default: pool.ntp.example, doc: the NTP server}
files:
  - path: /etc/chrony/chrony.conf
    content: |
      # site time
      server {{ server }} iburst
      makestep 1 3
"""
CONFIG = "name: site\nsummary: the site's values\nparams:\n  site:\n    server: {server}\n"
CONF = "/etc/chrony/chrony.conf"


def build(tree: Path) -> BuildResult:
    (result,) = Builder(load_tree(tree), "site", [], Progress(quiet=True)).build(["rv"])
    return result


@pytest.fixture(scope="module")
def two_builds(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ...]:
    t = tmp_path_factory.mktemp("review") / "tree"
    for d in ("images", "layers/site", "configs"):
        (t / d).mkdir(parents=True)
    (t / "images" / "rv.yaml").write_text(IMAGE)
    (t / "layers" / "site" / "layer.yaml").write_text(SITE)
    (t / "configs" / "site.yaml").write_text(CONFIG.format(server="ntp-a.example"))
    (t / ".gitignore").write_text("build/\n")
    subprocess.run(["git", "-C", str(t), "init", "-q"], check=True)
    first = build(t)
    (t / "configs" / "site.yaml").write_text(CONFIG.format(server="ntp-b.example"))
    second = build(t)
    assert first.plan.key != second.plan.key
    image_dir = t / "build" / "images" / output_name(second.plan)  # rv@site: the config changes the image
    return t, image_dir, Path(str(first.plan.key)), Path(str(second.plan.key))


def test_diff_previous_names_layer_parameter_and_changed_line(two_builds: tuple[Path, ...]) -> None:
    tree, image_dir, key_a, key_b = two_builds
    kept = sorted((image_dir / history.DIR).iterdir())
    assert [p.name for p in kept] == ["000001.json"]  # the first build's manifest, moved aside by the second
    assert json.loads(kept[0].read_text())["plan_key"] == str(key_a)
    assert json.loads((image_dir / "manifest.json").read_text())["plan_key"] == str(key_b)

    lines, changed = diff.diff_previous(image_dir)
    assert changed
    assert f"plan {str(key_a)[:12]}" in lines[0] and f"plan {str(key_b)[:12]}" in lines[1]
    assert f"  ~ site {str(key_a)[:12]} -> {str(key_b)[:12]}" in lines  # the layer, key old -> new
    assert ("  ~ site.server ntp-a.example -> ntp-b.example (config site (configs/site.yaml:5))" in lines
            ), lines  # the parameter and where it was set
    assert any(ln.startswith(f"  ~ {CONF} sha256 ") and ln.endswith("(layer site)") for ln in lines), lines
    assert "      -server ntp-a.example iburst" in lines and "      +server ntp-b.example iburst" in lines
    # the same as a diff of the two files by hand
    by_hand, _ = diff.diff_manifests(str(kept[0]), str(image_dir / "manifest.json"))
    assert by_hand == lines

    md, _ = diff.diff_previous(image_dir, "markdown")
    assert "    +server ntp-b.example iburst" in md
    assert any(r.startswith(f"| changed | `{CONF}` |") and "`layer site`" in r for r in md)
    # the key a reviewer matches: the one `nodeforge plan` prints
    assert compose(load_tree(tree), "rv", "site").key == str(key_b)
