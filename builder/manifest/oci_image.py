"""Normalised OCI images: a built image read from the engine (docker save) and rewritten so that
its bytes depend only on the image's content and SOURCE_DATE_EPOCH. Its manifest digest is the
image's reproducible digest: two clean builds of the same definitions and lock give the same one.
The rollout manifest records it; `nodeforge export oci` writes the whole layout.

Layers: see layer_tar. Config: `created` and every history entry at the epoch; the engine's
leftovers (container, container_config, docker_version, hostname) dropped; COPY sources named
without the legacy builder's context hash (it depends on file times); the base named without a
build's engine namespace and without its engine id (an import-time value, not a registry digest)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ..errors import BuildFailed, EnvironmentProblem
from . import layer_tar

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"  # uncompressed: see layer_tar
REF_NAME = "org.opencontainers.image.ref.name"
IMAGE_NAME = "io.containerd.image.name"  # the full reference, as containerd's exports name it
BASE_DIGEST_LABEL = "org.opencontainers.image.base.digest"
# the parts of an engine config the OCI image spec defines; the rest is engine state
CONFIG_KEYS = ("User", "ExposedPorts", "Env", "Entrypoint", "Cmd", "Volumes", "WorkingDir", "Labels", "StopSignal")
_COPY_HASH = re.compile(r"\b(COPY|ADD) (dir|file|multi):[0-9a-f]{64}")
_NAMESPACED = re.compile(r"\bnodeforge-(base|cache)-[a-z0-9._-]+:")
_BASE_DIGEST = re.compile(r" ?" + re.escape(BASE_DIGEST_LABEL) + r"=sha256:[0-9a-f]{64}")


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def epoch_time(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def scrub(text: str) -> str:
    """A history line or label value without what differs between two builds of the same content."""
    text = _COPY_HASH.sub(r"\1 \2", text)
    text = _NAMESPACED.sub(r"nodeforge-\1:", text)
    return _BASE_DIGEST.sub("", text)


def normalise_config(config: dict[str, Any], diff_ids: list[str], epoch: int) -> dict[str, Any]:
    when = epoch_time(epoch)
    inner = config.get("config") or {}
    run = {k: inner[k] for k in CONFIG_KEYS if inner.get(k) not in (None, "", [], {})}
    if "Labels" in run:
        run["Labels"] = {k: scrub(v) for k, v in run["Labels"].items() if k != BASE_DIGEST_LABEL}
    history = []
    for h in config.get("history") or []:
        entry: dict[str, Any] = {"created": when, "created_by": scrub(h.get("created_by", ""))}
        for key in ("author", "comment"):
            if h.get(key):
                entry[key] = h[key]
        if h.get("empty_layer"):
            entry["empty_layer"] = True
        history.append(entry)
    if history and sum(1 for h in history if not h.get("empty_layer")) != len(diff_ids):
        raise BuildFailed(f"the image's history names {sum(1 for h in history if not h.get('empty_layer'))} "
                          f"layers, its root filesystem has {len(diff_ids)}; rebuild it")
    out = {"architecture": config.get("architecture", "amd64"), "os": config.get("os", "linux"), "created": when,
           "config": run, "rootfs": {"type": "layers", "diff_ids": diff_ids}, "history": history}
    if config.get("variant"):
        out["variant"] = config["variant"]
    return out


class _Stream:
    """The engine's `docker save` chunks as a readable file."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.chunk, self.pos = chunks, b"", 0

    def read(self, n: int = -1) -> bytes:
        parts, wanted = [], n
        while wanted != 0:
            if self.pos >= len(self.chunk):
                self.chunk, self.pos = next(self.chunks, b""), 0
                if not self.chunk:
                    break
            end = len(self.chunk) if wanted < 0 else min(len(self.chunk), self.pos + wanted)
            parts.append(self.chunk[self.pos:end])
            wanted -= (end - self.pos) if wanted > 0 else 0
            self.pos = end
        return b"".join(parts)


def save(c: docker.DockerClient, ref: str, into: Path) -> tuple[dict[str, Any], list[Path]]:
    """The image's config and its layer tars (in order), unpacked from `docker save` into `into`."""
    try:
        chunks = c.api.get_image(ref, chunk_size=1 << 20)
        with tarfile.open(fileobj=_Stream(iter(chunks)), mode="r|") as t:  # type: ignore[call-overload]
            t.extractall(into, filter="data")
    except docker.errors.ImageNotFound:
        raise EnvironmentProblem(f"{ref} is not in the engine; build it first (`nodeforge build`)") from None
    (entry,) = json.loads((into / "manifest.json").read_text())
    config = json.loads((into / entry["Config"]).read_text())
    return config, [into / p for p in entry["Layers"]]


@dataclass(frozen=True)
class Normalised:
    """A normalised image: its layers' blobs (in order), its config and manifest documents."""

    layers: list[layer_tar.Blob]
    config: bytes
    manifest: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest).hexdigest()


def engine_diff_ids(config: dict[str, Any]) -> list[str]:
    """The engine's own digests of the uncompressed layers, in order (as `docker save` has them)."""
    return list((config.get("rootfs") or {}).get("diff_ids") or [])


def normalise(config: dict[str, Any], layers: list[Path], epoch: int, blobs: Path | None = None,
              known: Mapping[str, layer_tar.Blob] | None = None) -> Normalised:
    """Normalise an engine image (its config and layer tars, which are used up). Layer blobs are
    written into `blobs` when given; otherwise only hashed, and a layer whose engine digest is in
    `known` is not read at all (its normalised blob is a function of its bytes and the epoch)."""
    known = known or {}
    ids = engine_diff_ids(config)
    out = []
    for i, layer in enumerate(layers):
        engine_id = ids[i] if i < len(ids) else ""
        if blobs is None and engine_id in known:
            out.append(known[engine_id])
        elif blobs is None:
            out.append(layer_tar.normalise(layer, None, epoch))
        else:
            tmp = blobs / f".layer-{i}"
            b = layer_tar.normalise(layer, tmp, epoch)
            os.replace(tmp, blobs / b.digest.removeprefix("sha256:"))
            out.append(b)
        layer.unlink()
    return assemble(config, out, epoch)


def assemble(config: dict[str, Any], layers: list[layer_tar.Blob], epoch: int) -> Normalised:
    """The normalised image of an engine config whose layers normalised to `layers`."""
    cfg = canonical(normalise_config(config, [b.diff_id for b in layers], epoch))
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                "config": {"mediaType": CONFIG_TYPE, **_descriptor(cfg)},
                "layers": [{"mediaType": LAYER_TYPE, "digest": b.digest, "size": b.size} for b in layers]}
    return Normalised(layers, cfg, canonical(manifest))


def _descriptor(data: bytes) -> dict[str, Any]:
    return {"digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}


def write_layout(config: dict[str, Any], layers: list[Path], ref: str, epoch: int, layout: Path) -> str:
    """Normalise an engine image (its config and layer tars, which are used up) into the new
    directory `layout`, named `ref` there; returns the manifest digest."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    image = normalise(config, layers, epoch, blobs)
    for data in (image.config, image.manifest):
        (blobs / hashlib.sha256(data).hexdigest()).write_bytes(data)
    tag = ref.rpartition(":")[2] if ":" in ref.rpartition("/")[2] else "latest"
    index = {"schemaVersion": 2, "mediaType": INDEX_TYPE,
             "manifests": [{"mediaType": MANIFEST_TYPE, **_descriptor(image.manifest),
                            "annotations": {REF_NAME: tag, IMAGE_NAME: ref}}]}
    (layout / "index.json").write_bytes(canonical(index))
    (layout / "oci-layout").write_bytes(canonical({"imageLayoutVersion": "1.0.0"}))
    return image.digest
