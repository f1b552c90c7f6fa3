"""A tag and a lock belong to one (image, config) pair: a config that changes an image builds it under
tags qualified by the config and locks it in images/NAME@CONFIG.lock, never moving the plain tag or
lock (nor another config's); a build never writes a lock file; every pair of the repository is locked."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from support.trees import SITE_LAYER

from builder import lockfile
from builder.compose import compose
from builder.compose.image import lock_config, output_name, qualify_tag
from builder.compose.pairs import owners, pairs, unlocked
from builder.definitions.load import load_tree
from builder.paths import build_dir

ROOT = Path(__file__).resolve().parent.parent


def _config(root: Path, name: str, text: str, kind: str = "container") -> None:
    (root / "configs" / f"{name}.yaml").write_text(
        f"name: {name}\nsummary: site {name}\nlayers:\n  {kind}: [site-motd]\nparams:\n  site-motd:\n"
        f"    text: {text}\n")


@pytest.fixture
def site_tree(scratch_tree: Path) -> Path:
    (scratch_tree / "layers" / "site-motd").mkdir()
    (scratch_tree / "layers" / "site-motd" / "layer.yaml").write_text(SITE_LAYER)
    _config(scratch_tree, "site-a", "alpha")
    _config(scratch_tree, "site-b", "beta")
    (scratch_tree / "configs" / "quiet.yaml").write_text("name: quiet\nsummary: changes nothing\n")
    return scratch_tree


def test_qualified_tags_fit_the_engine_s_tag_grammar() -> None:
    assert qualify_tag("nodeforge/node-minimal:0.1.0", "acme") == "nodeforge/node-minimal:0.1.0-acme"
    assert qualify_tag("registry:5000/x/y", "a+b") == "registry:5000/x/y:latest-a_b"
    assert qualify_tag("registry:5000/x/y:1", "dgx-h100") == "registry:5000/x/y:1-dgx-h100"


def test_a_config_that_changes_an_image_owns_qualified_tags_and_lock(site_tree: Path) -> None:
    tree = load_tree(site_tree)
    plain, a, b = (compose(tree, "container-base", c) for c in (None, "site-a", "site-b"))
    assert plain.tags == ("nodeforge/container-base:bookworm",)
    assert a.tags == ("nodeforge/container-base:bookworm-site-a",) and lock_config(a) == "site-a"
    assert b.tags == ("nodeforge/container-base:bookworm-site-b",) and lock_config(b) == "site-b"
    assert output_name(a) == "container-base@site-a" and output_name(plain) == "container-base"
    quiet = compose(tree, "container-base", "quiet")  # leaves the plan as it is: the plain tag and lock
    assert quiet.key == plain.key and quiet.tags == plain.tags and lock_config(quiet) is None


def test_parents_follow_the_same_rule(site_tree: Path) -> None:
    tree = load_tree(site_tree)
    child = compose(tree, "cuda-12.9-base", "site-a")  # site-motd joins container-base, the parent
    parent = compose(tree, "container-base", "site-a")
    assert child.base.key == parent.key and lock_config(parent) == "site-a"
    assert all(t.endswith("-site-a") for t in (*child.tags, *parent.tags))
    assert compose(tree, "container-base").tags == ("nodeforge/container-base:bookworm",)


def test_the_lock_of_the_config_is_read_and_written_under_its_own_name(site_tree: Path) -> None:
    tree = load_tree(site_tree)
    assert not all(s.locked for s in compose(tree, "container-base", "site-a").steps)  # no lock of its own yet
    plain = lockfile.read(site_tree, "container-base")
    assert plain is not None
    path = lockfile.write(site_tree, lockfile.Lock(plain.image, plain.base, plain.layers, config="site-a"))
    assert path == site_tree / "images" / "container-base@site-a.lock"
    again = lockfile.read(site_tree, "container-base", "site-a")
    assert again is not None and again.config == "site-a" and again.layers == plain.layers
    assert all(s.locked for s in compose(load_tree(site_tree), "container-base", "site-a").steps)
    assert lockfile.read(site_tree, "container-base") == plain  # the plain lock as it was


def test_check_all_pairs_covers_every_image_and_config(site_tree: Path) -> None:
    tree = load_tree(site_tree)
    got = {(p.image, p.config) for p in pairs(tree)}
    assert got == {(i, c) for i in tree.images for c in (None, *tree.configs)}
    names = owners(tree)
    assert {"container-base", "container-base@site-a", "container-base@site-b"} <= set(names)
    assert "container-base@quiet" not in names
    lines = unlocked(tree)
    assert any("images/container-base@site-a.lock" in line and "nodeforge lock container-base -c site-a" in line
               for line in lines)


def test_every_image_and_config_of_the_repository_is_fully_locked() -> None:
    """The committed locks pin every layer of every (image, config) pair: no build resolves afresh.
    `nodeforge lock IMAGE [-c CONFIG]` writes the lock a line names."""
    assert unlocked(load_tree(ROOT)) == []


def _state(root: Path, c: object, tags: list[str], outputs: list[str]) -> dict[str, str]:
    from builder.engine.recorded import image_labels

    got: dict[str, str] = {}
    for tag in tags:
        labels = image_labels(c, tag)  # type: ignore[arg-type]
        got[f"tag {tag}"] = repr(sorted((labels or {}).items()))
    for p in sorted((root / "images").glob("*.lock")):
        got[f"lock {p.name}"] = hashlib.sha256(p.read_bytes()).hexdigest()
    for name in outputs:
        d = build_dir(root) / "images" / name
        for f in sorted(d.rglob("*")) if d.is_dir() else []:
            if f.is_file():
                got[f"out build/images/{f.relative_to(d.parent)}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return got


@pytest.mark.docker
def test_two_configs_built_one_after_the_other_leave_each_other_alone(site_tree: Path,
                                                                      docker_client: object) -> None:
    """site-a (locked by its own lock) and then site-b (no lock: resolved under build/, no lock file
    written): each keeps the other's tags, locks and outputs, and the plain ones, as they were."""
    from builder.pipeline import Builder
    from builder.progress import Progress

    plain = lockfile.read(site_tree, "container-base")
    assert plain is not None
    lockfile.write(site_tree, lockfile.Lock(plain.image, plain.base, plain.layers, config="site-a"))
    tags = ["nodeforge/container-base:bookworm", "nodeforge/container-base:bookworm-site-a",
            "nodeforge/container-base:bookworm-site-b"]
    outputs = ["container-base", "container-base@site-a", "container-base@site-b"]
    (a,) = Builder(load_tree(site_tree), "site-a", [], Progress()).build(["container-base"])
    assert a.tags == ("nodeforge/container-base:bookworm-site-a",)
    after_a = _state(site_tree, docker_client, tags, outputs)
    (b,) = Builder(load_tree(site_tree), "site-b", [], Progress()).build(["container-base"])
    assert b.tags == ("nodeforge/container-base:bookworm-site-b",)
    after_b = _state(site_tree, docker_client, tags, outputs)
    touched = {k for k in after_b if after_a.get(k) != after_b[k]}
    assert all("site-b" in k for k in touched), sorted(touched)  # only site-b's own tag and outputs
    assert not (site_tree / "images" / "container-base@site-b.lock").exists()  # a build writes no lock file
    assert lockfile.resolved_path(site_tree, "container-base", "site-b").is_file()
    for name in ("site-a", "site-b"):  # each config's outputs (SBOM, manifest) in a directory of its own
        assert any(k.startswith(f"out build/images/container-base@{name}/") for k in after_b), sorted(after_b)


@pytest.fixture
def small_tree(tmp_path: Path) -> Path:
    """container-base alone, with configs site-a (its own lock, one version made bogus) and quiet."""
    import shutil

    shutil.copytree(ROOT / "layers", tmp_path / "layers")
    (tmp_path / "images").mkdir()
    (tmp_path / "configs").mkdir()
    for name in ("container-base.yaml", "container-base.lock"):
        shutil.copy(ROOT / "images" / name, tmp_path / "images" / name)
    (tmp_path / "layers" / "site-motd").mkdir()
    (tmp_path / "layers" / "site-motd" / "layer.yaml").write_text(SITE_LAYER)
    _config(tmp_path, "site-a", "alpha")
    (tmp_path / "configs" / "quiet.yaml").write_text("name: quiet\nsummary: changes nothing\n")
    plain = lockfile.read(tmp_path, "container-base")
    assert plain is not None
    layers = {**plain.layers, "base": {**plain.layers["base"],
                                       "direct": {**plain.layers["base"]["direct"], "procps": "0.0-bogus"}}}
    lockfile.write(tmp_path, lockfile.Lock(plain.image, plain.base, layers, config="site-a"))
    return tmp_path


@pytest.mark.docker
def test_check_locks_checks_every_lock_file_of_the_tree(small_tree: Path, docker_client: object) -> None:
    from builder.pipeline import check_locks
    from builder.progress import Progress

    before = {p.name: p.read_bytes() for p in (small_tree / "images").iterdir()}
    drift = check_locks(load_tree(small_tree), Progress(quiet=True))
    assert set(drift) == {"container-base", "container-base@site-a"}  # quiet owns no lock of its own
    assert any("procps 0.0-bogus" in line for line in drift["container-base@site-a"])
    assert not any("0.0-bogus" in line for line in drift["container-base"])
    assert {p.name: p.read_bytes() for p in (small_tree / "images").iterdir()} == before  # nothing written


@pytest.mark.docker
def test_lock_check_all_on_the_command_line(small_tree: Path, docker_client: object) -> None:
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "builder", "--root", str(small_tree), *args],
                              capture_output=True, text=True, cwd=ROOT)

    if "--all" not in cli("lock", "--help").stdout:
        pytest.skip("`nodeforge lock --check --all` is not wired in the command table yet")
    proc = cli("lock", "--check", "--all")
    assert proc.returncode == 1, proc.stderr
    assert "container-base@site-a" in proc.stdout and "procps 0.0-bogus" in proc.stdout
