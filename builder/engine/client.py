"""The Docker Engine, through the docker SDK. DOCKER_HOST selects a remote engine."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ..errors import EnvironmentProblem
from ..paths import build_dir

SESSION_LABEL = "io.nodeforge.test-session"  # every throwaway container carries it


# every container this process creates, until it is removed: what an interrupt cleans up
_created: set[str] = set()
_created_lock = threading.Lock()


def client() -> docker.DockerClient:
    try:
        c = docker.from_env(version="auto", timeout=900)
        c.ping()
    except Exception as e:
        where = os.environ.get("DOCKER_HOST", "the local socket (unix:///var/run/docker.sock)")
        raise EnvironmentProblem(
            f"no Docker Engine answers at {where} ({type(e).__name__}); start it with "
            "`systemctl start docker` (or `dockerd &` where there is no systemd; `make setup` does it), "
            "or point DOCKER_HOST at a running engine") from None
    _track_containers(c)
    return c


def _track_containers(c: docker.DockerClient) -> None:
    """Remember the id of every container created through this client (test containers, SBOM
    and lock readers, exports), so that an interrupt can remove the ones still there."""
    create = c.api.create_container

    def tracked(*args: Any, **kwargs: Any) -> Any:
        result = create(*args, **kwargs)
        if isinstance(result, dict) and result.get("Id"):
            with _created_lock:
                _created.add(result["Id"])
        return result

    c.api.create_container = tracked  # type: ignore[method-assign]


def remove_throwaway_containers() -> list[str]:
    """Force-remove every container this process created that still exists (after Ctrl-C);
    returns their short ids. Never touches containers of other processes."""
    with _created_lock:
        ids = sorted(_created)
        _created.clear()
    if not ids:
        return []
    try:
        c = docker.from_env(version="auto", timeout=60)
    except Exception:
        return []
    removed = []
    for cid in ids:
        try:
            c.api.remove_container(cid, force=True, v=True)
            removed.append(cid[:12])
        except docker.errors.NotFound:
            pass
        except Exception as e:  # the engine went away: say so, keep going
            print(f"could not remove container {cid[:12]}: {e}", file=sys.stderr)
    return removed


@contextlib.contextmanager
def image_lock(root: Path, image: str, wait: bool = True) -> Iterator[None]:
    """One build of an image at a time on this machine: an exclusive lock on
    <build dir>/locks/<image>.lock. A second build waits (saying so) or, with wait=False, is refused.
    The kernel drops the lock when the holder exits, however it exits."""
    lock_dir = build_dir(root) / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{image}.lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise EnvironmentProblem(f"another build of {image} is running (lock {lock_dir / image}.lock); "
                                         "wait for it to finish") from None
            print(f"{image}: waiting for another build of it to finish", file=sys.stderr)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
