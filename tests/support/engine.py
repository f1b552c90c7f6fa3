"""Builds in an engine namespace of their own, for tests that must build every step again.

    with own_namespace(docker_client, tmp_path, f"offline{os.getpid()}", TAGS) as env:
        subprocess.run([..., "build", ...], env=env)

`env` is os.environ with a build directory (tmp/build) and a cache namespace of the build's own,
plus any extra variables given; afterwards the output tags named are put back on the images they
named before (or removed where there were none), and the namespace's images are removed
(`remove_namespace`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
import docker.errors


@contextmanager
def own_namespace(client: docker.DockerClient, tmp: Path, namespace: str, tags: Iterable[str],
                  **extra: str) -> Iterator[dict[str, str]]:
    before: dict[str, str | None] = {}
    for ref in tags:
        try:
            before[ref] = client.api.inspect_image(ref)["Id"]
        except docker.errors.ImageNotFound:
            before[ref] = None
    try:
        yield {**os.environ, "NODEFORGE_BUILD_DIR": str(tmp / "build"), "NODEFORGE_CACHE_NAMESPACE": namespace,
               **extra}
    finally:
        for ref, image_id in before.items():
            repo, _, tag = ref.rpartition(":")
            if image_id:
                client.api.tag(image_id, repo, tag)
            else:
                subprocess.run(["docker", "rmi", ref], capture_output=True)
        remove_namespace(namespace)


def remove_namespace(namespace: str) -> None:
    """Remove the namespace's tags (by name: an id with child images cannot be removed, a tag can;
    untagged parents go with their last child)."""
    for repo in (f"nodeforge-cache-{namespace}", f"nodeforge-base-{namespace}"):
        refs = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", repo],
                              capture_output=True, text=True).stdout.split()
        if refs:
            subprocess.run(["docker", "rmi", *refs], capture_output=True)
