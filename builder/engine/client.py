"""The Docker Engine, through the docker SDK. DOCKER_HOST selects a remote engine."""

from __future__ import annotations

import os
import time
from typing import Any

import docker
import docker.errors

from ..errors import EnvironmentProblem

CACHE_REPO = "nodeforge-cache"
BASE_REPO = "nodeforge-base"
SESSION_LABEL = "io.nodeforge.test-session"  # every throwaway container carries it


def client() -> docker.DockerClient:
    try:
        c = docker.from_env(version="auto", timeout=900)
        c.ping()
        return c
    except Exception as e:
        where = os.environ.get("DOCKER_HOST", "the local socket")
        raise EnvironmentProblem(f"no Docker Engine answers at {where} ({type(e).__name__}); "
                                 "run `make setup` or set DOCKER_HOST") from None


def image_exists(c: docker.DockerClient, ref: str) -> bool:
    try:
        c.api.inspect_image(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def inspect(c: docker.DockerClient, ref: str) -> dict[str, Any]:
    data: dict[str, Any] = c.api.inspect_image(ref)
    return data


END_MARK = "@@nodeforge-end"


def finished_output(container: Any, what: str) -> str:
    """Standard output of an exited container that prints END_MARK last. The engine can hand
    out a short-lived container's log before its last lines are in: read again until the
    marker is there."""
    for _ in range(20):
        out: str = container.logs(stdout=True, stderr=False).decode(errors="replace")
        if END_MARK in out:
            return out
        time.sleep(0.5)
    raise EnvironmentProblem(f"{what}: the engine returned an incomplete log (no end marker); run it again")


def split_ref(ref: str) -> tuple[str, str]:
    repo, _, tag = ref.rpartition(":")
    if not repo or "/" in tag:
        return ref, "latest"
    return repo, tag
