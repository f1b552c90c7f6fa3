"""The reproducible digest of a built image: the manifest digest of its normalised OCI image (the
one `nodeforge export oci` writes), computed without writing the layout.

Computing it reads the layers not seen before (from the engine's overlay2 directories where they
are on this machine, node.tree.layer_dirs; through `docker save` elsewhere), so it is
kept in nodeforge's cache directory: by engine image id (a no-op rebuild costs a file read) and by
engine layer digest (a rebuild that changed the last layers normalises only those; images that
share layers, a parent and its children, normalise them once). Both are content addresses: an
engine id names one config and its layers, an engine layer digest one layer's bytes, and the
normalised layer is a function of those bytes and the epoch alone, so neither can go stale and
two isolated builds may share them. FORMAT changes when the normalisation does."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ..engine import cancel
from ..engine import client as engine
from ..engine.bootstrap import cache_dir as nodeforge_cache
from ..node.tree import layer_dirs
from ..plan import BuildPlan
from . import layer_dir, layer_tar, oci_image

FORMAT = 4  # 2: DKMS's make.log dropped; 3: uncompressed layers; 4: a file's data under its first name


@dataclass(frozen=True)
class Digests:
    image: str  # the image's normalised OCI manifest digest
    base: str | None  # the same of the image it was built on (a bootstrapped base or a parent image)


def cache_dir() -> Path:
    return nodeforge_cache() / "oci"


def _entry(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def _store(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
        json.dump({"format": FORMAT, **data}, f, sort_keys=True)
    Path(f.name).replace(path)


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def _layer_path(cache: Path, engine_diff_id: str, epoch: int) -> Path:
    return cache / "layers" / f"{_hex(engine_diff_id)}-{epoch}.json"


def _known_layers(cache: Path, config: dict[str, Any], epoch: int) -> dict[str, layer_tar.Blob]:
    known = {}
    for engine_id in oci_image.engine_diff_ids(config):
        e = _entry(_layer_path(cache, engine_id, epoch))
        if e is not None:
            known[engine_id] = layer_tar.Blob(e["digest"], e["diff_id"], e["size"])
    return known


def _local_layers(c: docker.DockerClient, image_id: str) -> tuple[dict[str, Any], list[Path]] | None:
    """(the engine's config document, its layer directories bottom first) where the engine keeps
    them on this machine in overlay2 (node.tree.layer_dirs); None elsewhere."""
    dirs = layer_dirs(c.api.inspect_image(image_id))
    if not dirs:
        return None
    try:
        store = Path(c.info()["DockerRootDir"]) / "image" / "overlay2" / "imagedb" / "content" / "sha256"
        config = json.loads((store / _hex(image_id)).read_bytes())
    except (OSError, KeyError, ValueError, docker.errors.APIError):
        return None
    if len(oci_image.engine_diff_ids(config)) != len(dirs):
        return None
    return config, [Path(d) for d in reversed(dirs)]


def _from_directories(config: dict[str, Any], dirs: list[Path], epoch: int,
                      known: dict[str, layer_tar.Blob]) -> list[layer_tar.Blob]:
    return [known.get(engine_id) or layer_tar.write(layer_dir.entries(d), None, epoch)
            for engine_id, d in zip(oci_image.engine_diff_ids(config), dirs, strict=True)]


def digest(c: docker.DockerClient, ref: str, epoch: int) -> str:
    """The normalised OCI manifest digest of the engine image `ref` (a tag or an id)."""
    image_id = engine.inspect(c, ref)["Id"]
    cache = cache_dir()
    path = cache / "images" / f"{_hex(image_id)}-{epoch}.json"
    hit = _entry(path)
    if hit is not None:
        return str(hit["digest"])
    cache.mkdir(parents=True, exist_ok=True)
    image: oci_image.Normalised | None = None
    local = _local_layers(c, image_id)
    if local is not None:
        config, dirs = local
        try:
            blobs = _from_directories(config, dirs, epoch, _known_layers(cache, config, epoch))
            image = oci_image.assemble(config, blobs, epoch)
        except (layer_dir.Unsupported, OSError):
            image = None
    if image is None:
        with tempfile.TemporaryDirectory(prefix=".saved-", dir=cache) as tmp, cancel.scratch(Path(tmp)):
            config, layers = oci_image.save(c, image_id, Path(tmp))
            image = oci_image.normalise(config, layers, epoch, known=_known_layers(cache, config, epoch))
    for engine_id, blob in zip(oci_image.engine_diff_ids(config), image.layers, strict=True):
        _store(_layer_path(cache, engine_id, epoch), {"digest": blob.digest, "diff_id": blob.diff_id,
                                                       "size": blob.size})
    _store(path, {"digest": image.digest})
    return image.digest


def of_build(c: docker.DockerClient, plan: BuildPlan, image_id: str, labels: dict[str, str]) -> Digests:
    """The digests a build's manifest records: the image's and its base's (the engine id the build
    labelled as its base)."""
    base_id = labels.get(oci_image.BASE_DIGEST_LABEL)
    base = digest(c, base_id, plan.base.epoch) if base_id else None
    return Digests(digest(c, image_id, plan.base.epoch), base)
