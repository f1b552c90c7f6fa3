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
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import lockfile
from ..compose.image import Memo, compose, lock_config, output_name
from ..compose.params import parse_sets
from ..definitions.load import Tree
from ..engine import sbom
from ..engine.labels import git_source
from ..node.assemble import NodeArtifacts
from ..plan import BuildPlan, sha256_file
from . import files, reader
from .image_digest import Digests
from .oci_image import scrub

# 2: the image and its base by their normalised OCI digests, no engine image id
# 3: inherited layers with their keys, `files` (what the layers write), `keys` (each key named)
FORMAT = 3
READABLE = reader.READABLE  # what `nodeforge diff` still reads
NAME = "manifest.json"


def builder_version() -> str:
    try:
        return metadata.version("nodeforge")
    except metadata.PackageNotFoundError:
        return "unknown"


def path_for(root: Path, output: str) -> Path:
    """Beside the image's SBOM, wherever the build directory is. output: compose.image.output_name
    (NAME, or NAME@CONFIG for a config that changes the image)."""
    return sbom.path_for(root, output).parent / NAME


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


def owners(tree: Tree, plan: BuildPlan, resolved: Mapping[str, lockfile.Lock]) -> list[tuple[str, str | None]]:
    """The image and the images it builds on, nearest first, each with the config that owns its lock
    and outputs (compose.image.lock_config): parents follow the rule of the tags and locks too, so
    each is composed again with the plan's config and --set values (and the build's resolutions)."""
    images = ancestry(tree, plan.image)
    own = lock_config(plan)
    if own is None:  # a config that changes a parent changes its base key, so the image too
        return [(i, None) for i in images]
    sets, memo, locks = parse_sets(list(plan.sets)), Memo(), dict(resolved)
    return [(plan.image, own),
            *((i, lock_config(compose(tree, i, plan.config, sets, memo=memo, locks=locks))) for i in images[1:])]


def _lock_of(root: Path, image: str, config: str | None,
             resolved: Mapping[str, lockfile.Lock]) -> tuple[lockfile.Lock | None, dict[str, Any] | None]:
    """The lock a build of (image, config) used, and its record: the lock file, or the build's own
    resolution under build/resolved/ (pipeline.Builder.resolved) where its lock file pins too little."""
    name = lockfile.lock_name(image, config)
    if name in resolved:
        p = lockfile.resolved_path(root, image, config)
        return resolved[name], ({"image": image, "path": f"build/resolved/{p.name}", "resolved": True,
                                 "sha256": sha256_file(p)} if p.is_file() else None)
    p = lockfile.path_for(root, image, config)
    record = {"image": image, "path": str(p.relative_to(root)), "sha256": sha256_file(p)} if p.is_file() else None
    return lockfile.read(root, image, config), record


def _layers(plan: BuildPlan, parent: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every layer with its step key; an inherited one with the key its image built it with (from
    the parent's manifest; null where that manifest is missing or of another build)."""
    def parameters(layer: str) -> dict[str, Any]:
        return {k.partition(".")[2]: {"value": v.value, "source": v.source}
                for k, v in sorted(plan.params.items()) if k.partition(".")[0] == layer}

    built = {x["name"]: x for x in (parent or {}).get("layers", [])}
    inherited = [{"name": n, "image": built.get(n, {}).get("image") or plan.base.image, "inherited": True,
                  "key": built.get(n, {}).get("key"), "summary": built.get(n, {}).get("summary"),
                  "parameters": parameters(n)}
                 for n in plan.inherited_layers]
    own = [{"name": s.layer, "image": plan.image, "key": s.key, "summary": s.summary, "parameters": parameters(s.layer)}
           for s in plan.steps]
    if plan.boot is not None:  # the step after the layers that writes their sysctl and kernel arguments
        own.append({"name": plan.boot.layer, "image": plan.image, "key": plan.boot.key, "summary": plan.boot.summary,
                    "parameters": {}})
    return inherited + own


def _keys(plan: BuildPlan, node: NodeArtifacts | None) -> dict[str, str | None]:
    """Each key of the build, named: `plan` is what `nodeforge plan` prints and the manifest's
    plan_key (a node's boot configuration step's key, else the last layer step's); a node's `content`
    (the engine step its disks are made of: its boot configuration on its initramfs step) and
    `assembly` (its disks) keys are node.json's content_key and key."""
    return {"plan": plan.key, "content": node.content_key if node else None, "assembly": node.key if node else None}


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
        out[sbom.path_for(root, output_name(plan)).name] = {"role": "sbom", "sha256": labels[sbom.LABEL]}
    if node is not None:
        roles = {f: r for r, f in node.files.items()}
        for f, sha in node.sha256.items():
            out[f] = {"role": roles.get(f, "file"), "sha256": sha}
        sums = Path(node.dir) / "SHA256SUMS"
        if sums.is_file():
            out[sums.name] = {"role": "checksums", "sha256": sha256_file(sums)}
    return out


def document(tree: Tree, plan: BuildPlan, digests: Digests, labels: dict[str, str],
             node: NodeArtifacts | None, resolved: Mapping[str, lockfile.Lock] | None = None) -> dict[str, Any]:
    """Nothing in it depends on the build host, the build directory or the engine's cache: two
    isolated builds of the same definitions and lock write the same bytes. resolved: the build's
    own resolutions by lock name (pipeline.Builder.resolved), recorded instead of the lock files."""
    root = tree.root
    pairs = owners(tree, plan, resolved or {})
    locks = [(i, *_lock_of(root, i, config, resolved or {})) for i, config in pairs]
    chain = [(i, lk) for i, lk, _ in locks if lk is not None]
    debs, _ = _sbom_packages(sbom.path_for(root, output_name(plan)))
    parent = (files.parent_manifest(path_for(root, lockfile.lock_name(*pairs[1])), plan.base.key)
              if plan.base.image and len(pairs) > 1 else None)
    doc: dict[str, Any] = {
        "format": FORMAT,
        "image": plan.image, "kind": plan.kind, "version": plan.version, "summary": plan.summary,
        "config": plan.config, "sets": list(plan.sets), "tags": list(plan.tags),
        "plan_key": plan.key, "keys": _keys(plan, node), "image_digest": digests.image, "registry_digest": None,
        "source_date_epoch": plan.base.epoch,
        "base": {"kind": plan.base.kind, "key": plan.base.key, "image": plan.base.image, "debian": plan.base.debian,
                 "name": scrub(labels.get("org.opencontainers.image.base.name") or "") or None,
                 "digest": digests.base},
        "layers": _layers(plan, parent),
        "files": files.of_plan(plan, [f for f in (parent or {}).get("files", [])]),
        "packages": _packages([lk for _, lk in chain], debs),
        "wheels": _wheels(chain),
        "kernel_cmdline": node.cmdline if node is not None else (plan.cmdline if plan.kind == "node" else None),
        "outputs": _outputs(root, plan, labels, node),
        "lock": locks[0][2],
        "inherited_locks": [r for _, _, r in locks[1:] if r],
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
