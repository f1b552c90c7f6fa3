"""The rollout manifest from a composed plan, an SBOM, the lock files and node.json (no engine):
what it records, that it is deterministic, and its provenance statement."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from builder import lockfile
from builder.compose import compose
from builder.compose.params import Override
from builder.definitions.load import load_tree
from builder.engine import sbom
from builder.errors import UsageError
from builder.manifest import document, provenance, record
from builder.manifest.image_digest import Digests
from builder.node.assemble import NodeArtifacts
from builder.paths import BUILD_DIR_VARIABLE

KEYS_TREE = Path(__file__).resolve().parents[1] / "fixtures" / "keys-tree"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def tree_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    t = tmp_path / "tree"
    shutil.copytree(KEYS_TREE, t)
    monkeypatch.setenv(BUILD_DIR_VARIABLE, str(tmp_path / "build-one"))
    return t


def status(packages: list[tuple[str, str, str]]) -> str:
    return "\n\n".join(f"Package: {n}\nStatus: install ok installed\nVersion: {v}\nArchitecture: {a}"
                       for n, v, a in packages) + "\n"


def node_artifacts(directory: Path, cmdline: str) -> NodeArtifacts:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "SHA256SUMS").write_text(f"{'1' * 64}  disk.raw\n")
    return NodeArtifacts("node-minimal", "k" * 64, "c" * 64, str(directory), "6.1.0-28-amd64", cmdline,
                         "nodeforge-root", "uuid", 1023, 956, files={"raw": "disk.raw", "kernel": "vmlinuz"},
                         sha256={"disk.raw": "1" * 64, "vmlinuz": "2" * 64})


def test_node_manifest_records_layers_packages_outputs_and_lock(tree_copy: Path) -> None:
    tree = load_tree(tree_copy)
    before = compose(tree, "node-minimal", "default")
    lock = lockfile.read(tree_copy, "node-minimal")
    assert lock is not None
    ca = lock.layers["base"]["direct"]["ca-certificates"]
    lockfile.write(tree_copy, lockfile.Lock(lock.image, lock.base, lock.layers, lock.wheels, {
        "ca-certificates": {"version": ca, "architecture": "all", "sha256": "a" * 64,
                            "origin": "Debian:12.15/oldstable"}}))
    plan = compose(load_tree(tree_copy), "node-minimal", "default")
    assert plan.key == before.key  # the .deb records are in no step key

    sbom_path = sbom.path_for(tree_copy, "node-minimal")
    sbom_path.parent.mkdir(parents=True)
    sbom_path.write_text(json.dumps(sbom.document(plan, status([("ca-certificates", ca, "all"),
                                                                ("libc6", "2.36-9+deb12u9", "amd64")]))))
    labels = {sbom.LABEL: sha(sbom_path), "org.opencontainers.image.base.name": "nodeforge-base:" + plan.base.key,
              "org.opencontainers.image.base.digest": "sha256:" + "d" * 64}
    node = node_artifacts(sbom_path.parent, "root=LABEL=nodeforge-root ro console=ttyS0,115200n8 iommu=pt")
    path = record.write(tree, plan, Digests("sha256:" + "e" * 64, "sha256:" + "b" * 64), labels, node)

    assert path == sbom_path.parent / "manifest.json"
    doc = json.loads(path.read_text())
    assert (doc["image"], doc["kind"], doc["config"], doc["sets"]) == ("node-minimal", "node", "default", [])
    assert doc["image_digest"] == "sha256:" + "e" * 64 and doc["registry_digest"] is None
    assert "engine_image_id" not in doc  # differs between two isolated builds of the same content
    assert doc["base"]["digest"] == "sha256:" + "b" * 64 and doc["base"]["name"] == "nodeforge-base:" + plan.base.key
    assert doc["plan_key"] == plan.key and doc["source_date_epoch"] == plan.base.epoch
    assert plan.boot is not None  # the layers, then the boot configuration step
    assert [(x["name"], x["key"]) for x in doc["layers"]] == [(s.layer, s.key) for s in (*plan.steps, plan.boot)]
    sysctl = next(x for x in doc["layers"] if x["name"] == "sysctl")
    assert sysctl["parameters"]["swappiness"] == {"value": plan.params["sysctl.swappiness"].value,
                                                  "source": plan.params["sysctl.swappiness"].source}
    assert doc["packages"] == [
        {"name": "ca-certificates", "version": ca, "architecture": "all", "layer": "base", "sha256": "a" * 64},
        {"name": "libc6", "version": "2.36-9+deb12u9", "architecture": "amd64", "layer": None, "sha256": None}]
    assert doc["kernel_cmdline"] == node.cmdline
    assert doc["outputs"] == {
        "disk.raw": {"role": "raw", "sha256": "1" * 64}, "vmlinuz": {"role": "kernel", "sha256": "2" * 64},
        "SHA256SUMS": {"role": "checksums", "sha256": sha(sbom_path.parent / "SHA256SUMS")},
        "sbom.spdx.json": {"role": "sbom", "sha256": sha(sbom_path)}}
    assert doc["lock"] == {"image": "node-minimal", "path": "images/node-minimal.lock",
                           "sha256": sha(tree_copy / "images" / "node-minimal.lock")}
    assert "source" not in doc  # not a git tree
    assert doc["builder"]["name"] == "nodeforge"
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "SHA256SUMS", "manifest.json", "provenance.intoto.json", "sbom.spdx.json"]  # no temporary file left

    stmt = json.loads((path.parent / provenance.NAME).read_text())
    subjects = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
    assert subjects["manifest.json"] == sha(path) and subjects["disk.raw"] == "1" * 64
    assert subjects[plan.tags[0]] == "e" * 64  # the image by its normalised OCI digest
    assert stmt["predicate"]["buildDefinition"]["externalParameters"] == {
        "image": "node-minimal", "config": "default", "sets": []}
    assert stmt["predicate"]["runDetails"]["builder"]["id"] == (
        f"https://nodeforge.dev/builder@{document.builder_version()}")


def test_manifest_is_the_same_bytes_from_the_same_build(tree_copy: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Written twice, and once more into another build directory: identical manifests and statements."""
    tree = load_tree(tree_copy)
    plan = compose(tree, "node-minimal", "default", [Override("sysctl", "swappiness", 5)])
    out = []
    for build_dir in ("build-one", "build-one", "build-two"):
        monkeypatch.setenv(BUILD_DIR_VARIABLE, str(tmp_path / build_dir))
        d = sbom.path_for(tree_copy, "node-minimal").parent
        path = record.write(tree, plan, Digests("sha256:" + "e" * 64, None), {}, node_artifacts(d, "root=LABEL=r ro"))
        out.append((path.read_bytes(), (path.parent / provenance.NAME).read_bytes()))
    assert out[0] == out[1] == out[2]
    doc = json.loads(out[0][0])
    assert doc["sets"] == ["sysctl.swappiness=5"]
    assert doc["layers"][2]["parameters"]["swappiness"]["source"].startswith("--set")
    assert list(doc) == sorted(doc)  # sorted keys


def test_child_image_lists_every_wheel_and_the_locks_it_builds_on(tree_copy: Path) -> None:
    tree = load_tree(tree_copy)
    plan = compose(tree, "cupy-cuda12.9", None)
    doc = document.document(tree, plan, Digests("sha256:" + "e" * 64, None), {}, None)
    chain = document.ancestry(tree, "cupy-cuda12.9")
    assert chain[0] == "cupy-cuda12.9" and chain[-1] == "container-base"
    assert [x["image"] for x in doc["inherited_locks"]] == chain[1:]
    for record_ in doc["inherited_locks"]:
        assert record_["sha256"] == sha(tree_copy / record_["path"])
    locked = {(n, w["version"], w["sha256"]) for i in chain if (lk := lockfile.read(tree_copy, i))
              for ws in lk.wheels.values() for n, w in ws.items()}
    assert locked and {(w["name"], w["version"], w["sha256"]) for w in doc["wheels"]} == locked
    assert all(w["url"].startswith("https://") for w in doc["wheels"])
    assert [x["name"] for x in doc["layers"]] == [*plan.inherited_layers, *(s.layer for s in plan.steps)]
    assert doc["kernel_cmdline"] is None and doc["outputs"] == {}
    packages = {p["name"]: p for p in doc["packages"]}  # no SBOM: what the locks say
    assert packages and all(p["layer"] for p in packages.values())


def test_each_build_keeps_the_previous_manifest_and_diff_previous_reads_it(tree_copy: Path) -> None:
    """A one-value change in a layer, built twice: the manifest it replaces is kept in history/
    (bounded, the same bytes kept once), and `diff_previous` names the layer (key old -> new), the
    parameter with where it was set, and the file with its changed line, without a copy by hand."""
    from builder import diff
    from builder.manifest import history

    tree = load_tree(tree_copy)
    before = compose(tree, "node-minimal", "default")
    after = compose(tree, "node-minimal", "default", [Override("sysctl", "swappiness", 5)])
    path = record.write(tree, before, Digests("sha256:" + "e" * 64, None), {}, None)
    with pytest.raises(UsageError, match="no previous build"):
        diff.diff_previous(path.parent)
    record.write(tree, after, Digests("sha256:" + "e" * 64, None), {}, None)
    record.write(tree, after, Digests("sha256:" + "e" * 64, None), {}, None)  # the same bytes: nothing kept
    assert [p.name for p in sorted((path.parent / history.DIR).iterdir())] == ["000001.json"]

    lines, changed = diff.diff_previous(path.parent)
    assert changed and lines[0].startswith(f"--- {path.parent / history.DIR / '000001.json'}")
    assert before.boot is not None and after.boot is not None  # a sysctl value is the boot configuration's
    assert f"  ~ boot-config {before.boot.key[:12]} -> {after.boot.key[:12]}" in lines
    assert any(ln.startswith("  ~ sysctl.swappiness 1 -> 5 (config default (configs/default.yaml:")
               and ln.endswith("-> --set sysctl.swappiness)") for ln in lines), lines
    conf = "/etc/sysctl.d/90-nodeforge-sysctl.conf"
    assert any(ln.startswith(f"  ~ {conf} sha256 ") and ln.endswith("(layer sysctl)") for ln in lines)
    assert "      -vm.swappiness = 1" in lines and "      +vm.swappiness = 5" in lines
    assert f"plan {after.key[:12]}" in lines[1]  # the key `nodeforge plan` prints
    md, _ = diff.diff_previous(path.parent, "markdown")
    assert "    +vm.swappiness = 5" in md

    for i in range(history.KEEP + 2):  # bounded: the last KEEP
        plan = compose(tree, "node-minimal", "default", [Override("sysctl", "swappiness", 10 + i)])
        record.write(tree, plan, Digests("sha256:" + "e" * 64, None), {}, None)
    kept = sorted(p.name for p in (path.parent / history.DIR).iterdir())
    assert kept == [f"{n:06d}.json" for n in range(4, 4 + history.KEEP)]


def test_manifest_records_files_keys_and_inherited_layer_keys(tree_copy: Path) -> None:
    """Files the layers write (with the lines of a small /etc text file), each key named, and an
    inherited layer with the key its image built it with (from the parent's manifest)."""
    tree = load_tree(tree_copy)
    node_plan = compose(tree, "node-minimal", "default")
    d = sbom.path_for(tree_copy, "node-minimal").parent
    node = json.loads(record.write(tree, node_plan, Digests("sha256:" + "e" * 64, None), {},
                                   node_artifacts(d, "root=LABEL=r ro")).read_text())
    assert node["keys"] == {"plan": node_plan.key, "content": "c" * 64, "assembly": "k" * 64}
    conf = next(f for f in node["files"] if f["path"] == "/etc/sysctl.d/90-nodeforge-sysctl.conf")
    assert conf["layer"] == "sysctl" and conf["mode"] == "0644" and "vm.swappiness = 1" in conf["lines"]
    assert conf["sha256"] == node_plan.files[conf["path"]].value
    assert [f["path"] for f in node["files"]] == sorted(node_plan.files)

    child = compose(tree, "cupy-cuda12.9", None)
    orphan = document.document(tree, child, Digests("sha256:" + "e" * 64, None), {}, None)
    assert all(x["key"] is None for x in orphan["layers"] if x.get("inherited"))  # no parent manifest yet
    for image in reversed(document.ancestry(tree, "cupy-cuda12.9")[1:]):  # the parents, built first
        record.write(tree, compose(tree, image, None), Digests("sha256:" + "e" * 64, None), {}, None)
    doc = document.document(tree, child, Digests("sha256:" + "e" * 64, None), {}, None)
    parent = json.loads(document.path_for(tree_copy, child.base.image or "").read_text())
    assert [(x["name"], x["key"], x["image"]) for x in doc["layers"] if x.get("inherited")] == [
        (x["name"], x["key"], x["image"]) for x in parent["layers"]]
    assert all(x["key"] for x in doc["layers"]) and doc["keys"]["plan"] == child.key == doc["plan_key"]
    inherited = [f for f in doc["files"] if f.get("inherited")]
    assert inherited and all(f["image"] != "cupy-cuda12.9" for f in inherited)
