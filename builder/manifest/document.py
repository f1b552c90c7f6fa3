"""The rollout manifest: what one build of an image shipped, exactly, in one deterministic JSON
document (sorted keys, no wall-clock time) beside the image's other outputs.

Read from what the build already has: the plan (layers, keys, parameters with their source, the
kernel command line), the SBOM (every installed package), the lock files of the image and of the
images it builds on (which layer brought a package, the .deb's sha256 where the resolver recorded
it, every wheel with its sha256 and URL), node.json (every output with its sha256) and git."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import lockfile
from ..definitions.load import Tree
from ..engine import sbom
from ..engine.labels import git_source
from ..node.assemble import NodeArtifacts
from ..plan import BuildPlan, sha256_file
from . import reader
from .image_digest import Digests
from .oci_image import scrub

FORMAT = 2  # 2: the image and its base by their normalised OCI digests, no engine image id
READABLE = reader.READABLE  # what `nodeforge diff` still reads
NAME = "manifest.json"


def builder_version() -> str:
    try:
        return metadata.version("nodeforge")
    except metadata.PackageNotFoundError:
        return "unknown"


def path_for(root: Path, image: str) -> Path:
    """Beside the image's SBOM, wherever the build directory is."""
    return sbom.path_for(root, image).parent / NAME


def source_revision(root: Path) -> dict[str, Any] | None:
    """The project tree's commit and whether tracked files differ from it; None outside git."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return None
    return {"revision": head.stdout.strip(), "dirty": bool(dirty.stdout.strip()), "repository": git_source(root)}


def ancestry(tree: Tree, image: str) -> list[str]:
    """The image and the images it builds on, nearest first."""
    chain = [image]
    while (parent := tree.images[chain[-1]].data["from"].get("image")) and parent not in chain:
        chain.append(parent)
    return chain


def _layers(plan: BuildPlan) -> list[dict[str, Any]]:
    def parameters(layer: str) -> dict[str, Any]:
        return {k.partition(".")[2]: {"value": v.value, "source": v.source}
                for k, v in sorted(plan.params.items()) if k.partition(".")[0] == layer}

    inherited = [{"name": n, "image": plan.base.image, "key": None, "parameters": parameters(n)}
                 for n in plan.inherited_layers]
    own = [{"name": s.layer, "image": plan.image, "key": s.key, "summary": s.summary, "parameters": parameters(s.layer)}
           for s in plan.steps]
    return inherited + own


def _sbom_packages(path: Path) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """(debs as (name, version, architecture), wheels as (name, version)) the SBOM lists."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return [], []
    debs, wheels = [], []
    for p in doc.get("packages", []):
        for ref in p.get("externalRefs", []):
            purl = ref.get("referenceLocator", "")
            if purl.startswith("pkg:deb/"):
                debs.append((p["name"], p.get("versionInfo", ""), purl.partition("?arch=")[2]))
            elif purl.startswith("pkg:pypi/"):
                wheels.append((p["name"], p.get("versionInfo", "")))
    return debs, wheels


def _packages(locks: list[lockfile.Lock], debs: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Every installed package; the layer that installed it (null: the bootstrapped base) and the
    .deb's sha256 where a lock recorded it for exactly that version."""
    layer_of: dict[str, tuple[str, str]] = {}
    archive: dict[str, dict[str, str]] = {}
    for lock in reversed(locks):  # nearest image last: it wins
        for layer, entry in lock.layers.items():
            for part in ("deps", "direct"):
                for name, version in entry.get(part, {}).items():
                    layer_of[name] = (layer, version)
        archive.update(lock.archives)
    if not debs:  # no SBOM: what the locks say
        debs = [(n, v, archive.get(n, {}).get("architecture", "")) for n, (_, v) in layer_of.items()]
    out = []
    for name, version, arch in sorted(set(debs)):
        known = archive.get(name, {})
        out.append({"name": name, "version": version, "architecture": arch,
                    "layer": layer_of[name][0] if name in layer_of else None,
                    "sha256": known.get("sha256") if known.get("version") == version else None})
    return out


def _wheels(chain: list[tuple[str, lockfile.Lock]]) -> list[dict[str, Any]]:
    out = []
    for image, lock in chain:
        for layer, wheels in sorted(lock.wheels.items()):
            for name, w in sorted(wheels.items()):
                out.append({"name": name, "version": w.get("version"), "sha256": w.get("sha256"), "url": w.get("url"),
                            "layer": layer, "image": image, "direct": w.get("direct") == "true"})
    return sorted(out, key=lambda w: (w["name"], w["image"], w["layer"]))


def _outputs(root: Path, plan: BuildPlan, labels: dict[str, str], node: NodeArtifacts | None) -> dict[str, Any]:
    """Every file the build leaves beside the manifest, with its sha256 (node.json's, not recomputed)."""
    out: dict[str, Any] = {}
    if labels.get(sbom.LABEL):
        out[sbom.path_for(root, plan.image).name] = {"role": "sbom", "sha256": labels[sbom.LABEL]}
    if node is not None:
        roles = {f: r for r, f in node.files.items()}
        for f, sha in node.sha256.items():
            out[f] = {"role": roles.get(f, "file"), "sha256": sha}
        sums = Path(node.dir) / "SHA256SUMS"
        if sums.is_file():
            out[sums.name] = {"role": "checksums", "sha256": sha256_file(sums)}
    return out


def _lock_record(root: Path, image: str) -> dict[str, str] | None:
    p = lockfile.path_for(root, image)
    return {"image": image, "path": str(p.relative_to(root)), "sha256": sha256_file(p)} if p.is_file() else None


def document(tree: Tree, plan: BuildPlan, digests: Digests, labels: dict[str, str],
             node: NodeArtifacts | None) -> dict[str, Any]:
    """Nothing in it depends on the build host, the build directory or the engine's cache: two
    isolated builds of the same definitions and lock write the same bytes."""
    root = tree.root
    images = ancestry(tree, plan.image)
    chain = [(i, lk) for i in images if (lk := lockfile.read(root, i)) is not None]
    debs, _ = _sbom_packages(sbom.path_for(root, plan.image))
    doc: dict[str, Any] = {
        "format": FORMAT,
        "image": plan.image, "kind": plan.kind, "version": plan.version, "summary": plan.summary,
        "config": plan.config, "sets": list(plan.sets), "tags": list(plan.tags),
        "plan_key": plan.key, "image_digest": digests.image, "registry_digest": None,
        "source_date_epoch": plan.base.epoch,
        "base": {"kind": plan.base.kind, "key": plan.base.key, "image": plan.base.image, "debian": plan.base.debian,
                 "name": scrub(labels.get("org.opencontainers.image.base.name") or "") or None,
                 "digest": digests.base},
        "layers": _layers(plan),
        "packages": _packages([lk for _, lk in chain], debs),
        "wheels": _wheels(chain),
        "kernel_cmdline": node.cmdline if node is not None else (plan.cmdline if plan.kind == "node" else None),
        "outputs": _outputs(root, plan, labels, node),
        "lock": _lock_record(root, plan.image),
        "inherited_locks": [r for i in images[1:] if (r := _lock_record(root, i))],
        "builder": {"name": "nodeforge", "version": builder_version()},
    }
    source = source_revision(root)
    if source is not None:
        doc["source"] = source
    return doc


def dumps(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n").encode()


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> dict[str, Any]:
    """A manifest file checked against its schema (manifest.reader); a UsageError (exit 2) names the
    file and the key of whatever is wrong."""
    return reader.read(path)
