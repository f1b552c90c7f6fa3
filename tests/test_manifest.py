"""The rollout manifest of a real container build (a small image in a git tree of its own): its
content against the build, the image and the lock; the same bytes from a second build; its
provenance; `nodeforge diff` of two manifests; `lock --check` naming the origin of a new version."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
import pytest

from builder import lockfile
from builder.definitions.load import load_tree
from builder.export import oci
from builder.pipeline import Builder, BuildResult
from builder.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
IMAGE = """name: mf
summary: a small container image for manifest tests
kind: container
version: "1.0"
from:
  debian: {suite: bookworm, components: [main, contrib, non-free, non-free-firmware]}
source-date-epoch: 1735689600
layers: [base, t1]
outputs: {tags: ["nodeforge-test/mf:1.0"]}
"""
T1 = ("name: t1\nsummary: writes one file\nfiles:\n  - {path: /etc/t1.txt, source: t1.txt}\n"
      "tests:\n  - name: t1 file\n    file: {path: /etc/t1.txt, content: {equals: 't1'}}\n")


def git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def build(tree: Path) -> BuildResult:
    (result,) = Builder(load_tree(tree), None, [], Progress(quiet=True)).build(["mf"])
    return result


def run_cli(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", "--root", str(tree), *args],
                          capture_output=True, text=True, cwd=ROOT)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def built(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BuildResult]:
    t = tmp_path_factory.mktemp("manifest") / "tree"
    for d in ("layers", "configs"):
        shutil.copytree(ROOT / d, t / d)
    (t / "images").mkdir()
    (t / "images" / "mf.yaml").write_text(IMAGE)
    (t / "layers" / "t1" / "files").mkdir(parents=True)
    (t / "layers" / "t1" / "layer.yaml").write_text(T1)
    (t / "layers" / "t1" / "files" / "t1.txt").write_text("t1")
    (t / ".gitignore").write_text("build/\n")
    locked = run_cli(t, "lock", "mf")  # a build writes no lock file (a tracked file): images/mf.lock is made here
    assert locked.returncode == 0, locked.stderr
    git(t, "init", "-q")
    git(t, "add", ".")
    git(t, "commit", "-q", "-m", "definitions")
    return t, build(t)


def manifest_of(tree: Path) -> Path:
    return tree / "build" / "images" / "mf" / "manifest.json"


def test_manifest_of_a_built_container_image(built: tuple[Path, BuildResult], docker_client: docker.DockerClient,
                                            tmp_path: Path) -> None:
    tree, result = built
    doc = json.loads(manifest_of(tree).read_text())
    assert (doc["image"], doc["kind"], doc["version"], doc["config"], doc["sets"]) == ("mf", "container", "1.0",
                                                                                      None, [])
    exported = oci.export(docker_client, result.ref, result.plan.base.epoch, tmp_path / "oci")
    assert doc["image_digest"] == exported and doc["registry_digest"] is None  # what `export oci` writes
    assert "engine_image_id" not in doc
    assert doc["tags"] == ["nodeforge-test/mf:1.0"] and doc["plan_key"] == result.plan.key
    assert [(x["name"], x["key"]) for x in doc["layers"]] == [(s.layer, s.key) for s in result.plan.steps]
    tools = doc["layers"][0]["parameters"]["tools"]
    assert tools["value"] == result.plan.params["base.tools"].value and "layers/base/layer.yaml" in tools["source"]
    lock = lockfile.read(tree, "mf")
    assert lock is not None
    packages = {p["name"]: p for p in doc["packages"]}
    ca = packages["ca-certificates"]
    assert ca["version"] == lock.layers["base"]["direct"]["ca-certificates"] and ca["layer"] == "base"
    assert ca["architecture"] == "all" and ca["sha256"] == lock.archives["ca-certificates"]["sha256"]
    assert len(ca["sha256"]) == 64
    assert packages["libc6"]["layer"] is None and packages["libc6"]["architecture"] == "amd64"  # the base's
    for name, entry in lock.layers["base"]["deps"].items():  # every .deb a layer installed has its sha256
        assert packages[name]["version"] == entry and packages[name]["sha256"], name
    sbom_path = manifest_of(tree).with_name("sbom.spdx.json")
    assert doc["outputs"] == {"sbom.spdx.json": {"role": "sbom", "sha256": sha(sbom_path)}}
    assert doc["lock"] == {"image": "mf", "path": "images/mf.lock", "sha256": sha(tree / "images" / "mf.lock")}
    assert doc["source"] == {"revision": git(tree, "rev-parse", "HEAD"), "dirty": False, "repository": "local"}
    assert doc["kernel_cmdline"] is None and doc["wheels"] == []
    base_id = result.labels["org.opencontainers.image.base.digest"]  # the engine's id of the bootstrapped base
    assert doc["base"]["digest"] == oci.export(docker_client, doc["base"]["name"], result.plan.base.epoch,
                                               tmp_path / "oci-base", source=base_id)
    assert doc["base"]["name"] == "nodeforge-base:" + result.plan.base.key


def test_a_second_build_writes_the_same_manifest(built: tuple[Path, BuildResult]) -> None:
    tree, _ = built
    path = manifest_of(tree)
    first = path.read_bytes(), path.with_name("provenance.intoto.json").read_bytes()
    again = build(tree)
    assert {s.status for s in again.steps} == {"cached"}
    assert (path.read_bytes(), path.with_name("provenance.intoto.json").read_bytes()) == first
    assert not [p.name for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_provenance_statement(built: tuple[Path, BuildResult]) -> None:
    tree, _ = built
    stmt = json.loads(manifest_of(tree).with_name("provenance.intoto.json").read_text())
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["predicateType"] == "https://slsa.dev/provenance/v1"
    doc = json.loads(manifest_of(tree).read_text())
    assert {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]} == {
        "nodeforge-test/mf:1.0": doc["image_digest"].removeprefix("sha256:"),
        "sbom.spdx.json": sha(manifest_of(tree).with_name("sbom.spdx.json")), "manifest.json": sha(manifest_of(tree))}
    definition = stmt["predicate"]["buildDefinition"]
    assert definition["externalParameters"] == {"image": "mf", "config": None, "sets": []}
    deps = {d["name"]: d for d in definition["resolvedDependencies"]}
    assert deps["images/mf.lock"]["digest"] == {"sha256": sha(tree / "images" / "mf.lock")}
    assert deps["source"]["digest"] == {"gitCommit": git(tree, "rev-parse", "HEAD")}
    base = next(d for d in definition["resolvedDependencies"] if d["name"].startswith("base:"))
    assert base["digest"]["sha256"] == doc["base"]["digest"].removeprefix("sha256:")
    assert stmt["predicate"]["runDetails"]["builder"]["id"].startswith("https://nodeforge.dev/builder@")


def edited(doc: dict[str, Any]) -> dict[str, Any]:
    """A parameter changed, a package version changed, a layer added."""
    new = copy.deepcopy(doc)
    new["layers"][0]["parameters"]["tools"] = {"value": ["procps"], "source": "--set base.tools=[procps]"}
    ca = next(p for p in new["packages"] if p["name"] == "ca-certificates")
    ca["version"] += "+local1"
    new["layers"].append({"name": "t2", "image": "mf", "key": "f" * 64, "summary": "writes one file",
                          "parameters": {}})
    return new


def test_diff_of_two_manifests_text_and_markdown(built: tuple[Path, BuildResult], tmp_path: Path) -> None:
    tree, _ = built
    a = manifest_of(tree)
    doc = json.loads(a.read_text())
    b = tmp_path / "after.json"
    b.write_text(json.dumps(edited(doc)))
    ca = next(p for p in doc["packages"] if p["name"] == "ca-certificates")["version"]

    same = run_cli(tree, "diff", str(a), str(a))
    assert same.returncode == 0 and len(same.stdout.splitlines()) == 2, same.stderr
    proc = run_cli(tree, "diff", str(a), str(b))
    assert proc.returncode == 1, proc.stderr
    tools = json.dumps(doc["layers"][0]["parameters"]["tools"]["value"])
    source = doc["layers"][0]["parameters"]["tools"]["source"]
    assert f"  ~ base.tools {tools} -> [\"procps\"] ({source} -> --set base.tools=[procps])" in proc.stdout
    assert f"  ~ ca-certificates:all {ca} -> {ca}+local1" in proc.stdout
    assert "  + t2 ffffffffffff" in proc.stdout
    md = run_cli(tree, "diff", str(a), str(b), "--format", "markdown")
    assert md.returncode == 1, md.stderr
    lines = md.stdout.splitlines()
    assert lines[0] == "## Rollout review: mf 1.0 → mf 1.0"
    assert "**layers**: 1 (1 added)" in md.stdout and "**packages**: 1 (1 changed)" in md.stdout
    assert f"| changed | `ca-certificates:all` | `{ca}` | `{ca}+local1` |" in lines
    assert "| added | `t2` |  | `ffffffffffff` |" in lines
    assert any(line.startswith("| changed | `base.tools` |") and "--set base.tools=[procps]" in line for line in lines)


def test_lock_check_names_old_and_new_version_and_the_origin(built: tuple[Path, BuildResult]) -> None:
    tree, _ = built
    path = tree / "images" / "mf.lock"
    text = path.read_text()
    lock = lockfile.read(tree, "mf")
    assert lock is not None
    version = lock.layers["base"]["direct"]["ca-certificates"]
    origin = lock.archives["ca-certificates"]["origin"]
    path.write_text(text.replace(f"ca-certificates: {version}", "ca-certificates: 0.0-bogus", 1))
    try:
        check = run_cli(tree, "lock", "mf", "--check")
    finally:
        path.write_text(text)
    assert check.returncode == 1, check.stderr
    security = "security" if lockfile.from_security(origin) else "not security"
    assert f"~ base: ca-certificates 0.0-bogus -> {version} [{security}: {origin}]" in check.stdout.splitlines()


def test_diff_of_two_built_images_in_markdown(built: tuple[Path, BuildResult]) -> None:
    """The image form of diff reads the same way: the base the image was built on against the image."""
    tree, result = built
    base = result.labels["org.opencontainers.image.base.name"]
    proc = run_cli(tree, "diff", base, result.ref, "--format", "markdown")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"## Rollout review: {base} → {result.ref}"
    assert "**packages**: " in proc.stdout and "### Packages" in lines
    assert any(line.startswith("| added | `ca-certificates` |") for line in lines)
    assert any(line.startswith("| added | `etc/t1.txt` |") for line in lines)
    same = run_cli(tree, "diff", result.ref, result.ref, "--format", "markdown")
    assert same.returncode == 0 and "**No changes.**" in same.stdout
