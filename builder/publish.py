"""Stage 8: publish. Push every tag of the built images to an OCI registry and report digests."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import docker
import docker.errors

from .definitions.load import Tree
from .engine import client as engine
from .errors import BuildFailed, EnvironmentProblem, UsageError

_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")
RETRY_DELAYS = (1.0, 3.0)  # seconds before the second and the third attempt of one push


@dataclass(frozen=True)
class Pushed:
    image: str
    tag: str  # the registry reference pushed, HOST:PORT/repo:tag
    digest: str  # sha256:... of the manifest

    @property
    def by_digest(self) -> str:
        return f"{self.tag.rpartition(':')[0]}@{self.digest}"


def registry_for(tree: Tree, config_ref: str | None, given: str | None) -> str:
    """The registry to push to: --registry, else the config's site.registry; UsageError for neither."""
    config = tree.config(config_ref)  # a config that is not there is an error either way
    registry = given or ((config.data.get("site") or {}).get("registry") if config else None)
    if not registry:
        raise UsageError("no registry: give --registry HOST:PORT or set site.registry in the config")
    return str(registry)


def remote_ref(registry: str, tag: str) -> str:
    return f"{registry.rstrip('/')}/{tag}"


def _push_once(c: docker.DockerClient, repo: str, tag: str) -> tuple[str, str]:
    """(digest, error) of one push attempt; an engine that cannot reach the registry is an error too."""
    digest, error = "", ""
    try:
        for chunk in c.api.push(repo, tag=tag, stream=True, decode=True):
            if "error" in chunk:
                error = str(chunk["error"])
            aux = chunk.get("aux") or {}
            digest = aux.get("Digest", digest)
            m = _DIGEST.search(chunk.get("status", ""))
            digest = digest or (m.group(1) if m else "")
    except docker.errors.APIError as e:
        error = str(e.explanation or e)
    except OSError as e:  # the engine's connection dropped mid-stream
        error = f"{type(e).__name__}: {e}"
    if not error and not digest:
        error = "the registry returned no digest"
    return digest, error


def push_tag(c: docker.DockerClient, image: str, local: str, registry: str) -> Pushed:
    """Push one tag, retrying a failed push (RETRY_DELAYS); the registry-prefixed tag this makes
    in the engine is removed again whatever happens, so a failure leaves nothing half-tagged."""
    if not engine.image_exists(c, local):
        raise EnvironmentProblem(f"{local} is not built; run `nodeforge build images/{image}.yaml` first")
    ref = remote_ref(registry, local)
    repo, tag = engine.split_ref(ref)
    c.api.tag(local, repo, tag)
    try:
        errors = []
        for attempt in range(len(RETRY_DELAYS) + 1):
            if attempt:
                time.sleep(RETRY_DELAYS[attempt - 1])
            digest, error = _push_once(c, repo, tag)
            if not error:
                return Pushed(image, ref, digest)
            errors.append(error)
        raise BuildFailed(f"registry {registry}: push of {local} as {ref} failed {len(errors)} times; last error: "
                          f"{errors[-1]}. Check that the registry runs and answers at {registry} "
                          "(and that the engine may reach it), then push again")
    finally:
        try:
            c.api.remove_image(ref, noprune=True)  # the tag only: the image keeps its own tags
        except docker.errors.APIError:
            pass


def push(c: docker.DockerClient, images: list[tuple[str, tuple[str, ...]]], registry: str) -> list[Pushed]:
    """Push all tags of each (image name, tags) to registry HOST[:PORT][/path]. Every image must be
    built before anything is pushed; a failure names the registry and the tags already pushed."""
    if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._/-]+)?", registry):
        raise EnvironmentProblem(f"--registry {registry!r}: expected HOST[:PORT][/PATH], e.g. localhost:5000")
    for name, tags in images:
        for tag in tags:
            if not engine.image_exists(c, tag):
                raise EnvironmentProblem(f"{tag} is not built; run `nodeforge build images/{name}.yaml` first")
    done: list[Pushed] = []
    for name, tags in images:
        for tag in tags:
            try:
                done.append(push_tag(c, name, tag, registry))
            except BuildFailed as e:
                if done:
                    e.args = (f"{e}\nalready pushed: " + ", ".join(f"{p.tag}@{p.digest}" for p in done),)
                raise
    return done
