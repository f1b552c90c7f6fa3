"""Stage 8: publish. Push every tag of the built images to an OCI registry and report digests."""

from __future__ import annotations

import re
from dataclasses import dataclass

import docker
import docker.errors

from .engine import client as engine
from .errors import BuildFailed, EnvironmentProblem

_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")


@dataclass(frozen=True)
class Pushed:
    image: str
    tag: str  # the registry reference pushed, HOST:PORT/repo:tag
    digest: str  # sha256:... of the manifest

    @property
    def by_digest(self) -> str:
        return f"{self.tag.rpartition(':')[0]}@{self.digest}"


def remote_ref(registry: str, tag: str) -> str:
    return f"{registry.rstrip('/')}/{tag}"


def push_tag(c: docker.DockerClient, image: str, local: str, registry: str) -> Pushed:
    if not engine.image_exists(c, local):
        raise EnvironmentProblem(f"{local} is not built; run `nodeforge build images/{image}.yaml` first")
    ref = remote_ref(registry, local)
    repo, tag = engine.split_ref(ref)
    c.api.tag(local, repo, tag)
    digest, error = "", ""
    for chunk in c.api.push(repo, tag=tag, stream=True, decode=True):
        if "error" in chunk:
            error = chunk["error"]
        aux = chunk.get("aux") or {}
        digest = aux.get("Digest", digest)
        m = _DIGEST.search(chunk.get("status", ""))
        digest = digest or (m.group(1) if m else "")
    if error or not digest:
        raise BuildFailed(f"push of {ref} failed: {error or 'the registry returned no digest'}")
    return Pushed(image, ref, digest)


def push(c: docker.DockerClient, images: list[tuple[str, tuple[str, ...]]], registry: str) -> list[Pushed]:
    """Push all tags of each (image name, tags) to registry HOST[:PORT][/path]."""
    if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._/-]+)?", registry):
        raise EnvironmentProblem(f"--registry {registry!r}: expected HOST[:PORT][/PATH], e.g. localhost:5000")
    return [push_tag(c, name, tag, registry) for name, tags in images for tag in tags]
