"""Each (image, config) pair's outputs in a directory of its own: build/images/NAME for the plain
build and a config that leaves the image as it is, build/images/NAME@CONFIG for a config that changes
it; the manifest records the lock of each image of the chain by the same rule, or the build's own
resolution under build/resolved/."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.trees import SITE_LAYER

from builder import lockfile
from builder.compose import compose
from builder.compose.image import output_name
from builder.definitions.load import load_tree
from builder.engine import sbom
from builder.manifest import document
from builder.node import assemble
from builder.paths import build_dir


@pytest.fixture
def site_tree(scratch_tree: Path) -> Path:
    (scratch_tree / "layers" / "site-motd").mkdir()
    (scratch_tree / "layers" / "site-motd" / "layer.yaml").write_text(SITE_LAYER)
    (scratch_tree / "configs" / "site-a.yaml").write_text(
        "name: site-a\nsummary: site a\nlayers:\n  container: [site-motd]\nparams:\n  site-motd:\n    text: alpha\n")
    (scratch_tree / "configs" / "quiet.yaml").write_text("name: quiet\nsummary: changes nothing\n")
    return scratch_tree


def test_outputs_are_named_by_the_pair_that_owns_them(site_tree: Path) -> None:
    tree = load_tree(site_tree)
    plain, quiet, site = (compose(tree, "container-base", c, []) for c in (None, "quiet", "site-a"))
    assert [output_name(p) for p in (plain, quiet, site)] == ["container-base", "container-base",
                                                              "container-base@site-a"]
    images = build_dir(site_tree) / "images"
    assert sbom.path_for(site_tree, output_name(site)) == images / "container-base@site-a" / "sbom.spdx.json"
    assert document.path_for(site_tree, output_name(site)) == images / "container-base@site-a" / "manifest.json"
    assert assemble.output_dir(site_tree, output_name(plain)) == images / "container-base"


def test_the_chain_s_locks_follow_the_rule(site_tree: Path) -> None:
    tree = load_tree(site_tree)
    child = next(i.name for i in tree.images.values() if i.data["from"].get("image") == "container-base")
    site = compose(tree, child, "site-a", [])
    assert document.owners(tree, site, {})[:2] == [(child, "site-a"), ("container-base", "site-a")]
    quiet = compose(tree, child, "quiet", [])
    assert all(config is None for _, config in document.owners(tree, quiet, {}))


def test_the_build_s_own_resolution_is_recorded_where_it_was_used(site_tree: Path) -> None:
    plain = lockfile.read(site_tree, "container-base")
    assert plain is not None
    resolved = lockfile.Lock(plain.image, plain.base, plain.layers, config="site-a")
    path = lockfile.resolved_path(site_tree, "container-base", "site-a")
    path.parent.mkdir(parents=True)
    lockfile.write(site_tree, resolved, path)
    lock, record = document._lock_of(site_tree, "container-base", "site-a", {"container-base@site-a": resolved})
    assert lock is resolved and record is not None
    assert (record["path"], record["resolved"]) == ("build/resolved/container-base@site-a.lock", True)
    assert document._lock_of(site_tree, "container-base", "site-a", {}) == (None, None)  # no images/ lock file
    lock, record = document._lock_of(site_tree, "container-base", None, {})
    assert lock == plain and record is not None and record["path"] == "images/container-base.lock"
