"""The Docker Engine, through the docker SDK. DOCKER_HOST selects a remote engine."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ..errors import EnvironmentProblem
from ..paths import build_dir
from . import cancel

SESSION_LABEL = "io.nodeforge.test-session"  # every throwaway container carries it
OWNER_LABEL = "io.nodeforge.owner"  # the process that created a container: machine, boot, pid, start time
CHECK_TIMEOUT = 30  # seconds for the engine to answer its version and ping


# every container this process creates, until it is removed: what an interrupt cleans up
_created: set[str] = set()
_created_lock = threading.Lock()
_engine_used = False  # whether this process has spoken to an engine (an interrupt then asks it)


def client() -> docker.DockerClient:
    global _engine_used
    _engine_used = True
    try:
        c = docker.from_env(version="auto", timeout=CHECK_TIMEOUT)  # something that is no engine: no hang
        c.ping()
        c.api.timeout = 900  # a call of a real engine (a build's output, a large export) may take long
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
    and lock readers, exports), so that an interrupt can remove the ones still there. A container
    created with labels also gets this process's owner label (one created without is committed
    into an image, which would keep it). Once the build is stopped, none is created."""
    create = c.api.create_container

    def tracked(*args: Any, **kwargs: Any) -> Any:
        cancel.check()
        if kwargs.get("labels"):
            labels = kwargs["labels"]
            kwargs["labels"] = {**(labels if isinstance(labels, dict) else dict.fromkeys(labels, "")),
                                **owner_labels()}
        result = create(*args, **kwargs)
        cid = result.get("Id") if isinstance(result, dict) else None
        with _created_lock:
            if cid and not cancel.CANCELLED.is_set():
                _created.add(cid)
                return result
        if cid:  # stopped while it was being created: the clean-up has already run
            c.api.remove_container(cid, force=True, v=True)
            raise cancel.Cancelled()
        return result

    c.api.create_container = tracked  # type: ignore[method-assign]


def owner_of(pid: int) -> str | None:
    """A name for a running process that no later process shares: machine, boot, pid and start
    time (the kernel's); None when no such process runs."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return f"{_machine()} {boot} {pid} {fields[19]}"


def _machine() -> str:
    """This machine and process-id namespace (a pid means nothing outside its namespace)."""
    try:
        machine = Path("/etc/machine-id").read_text().strip() or socket.gethostname()
    except OSError:
        machine = socket.gethostname()
    try:
        return f"{machine}/{os.readlink('/proc/self/ns/pid').strip('pid:[]')}"
    except OSError:
        return machine


def owner_labels() -> dict[str, str]:
    """The label that names this process on every container it creates (see remove_orphans)."""
    return {OWNER_LABEL: owner_of(os.getpid()) or f"{_machine()} ? {os.getpid()} ?"}


def remove_throwaway_containers() -> list[str]:
    """Force-remove every container this process created that still exists (after Ctrl-C): those
    created through client() and those carrying this process's owner label (test containers);
    returns their short ids. Never touches containers of other processes."""
    with _created_lock:
        ids = sorted(_created)
        _created.clear()
    if not ids and not _engine_used:
        return []
    try:
        c = docker.from_env(version="auto", timeout=60)
    except Exception:
        return []
    try:
        mine = owner_labels()[OWNER_LABEL]
        ids += [x["Id"] for x in c.api.containers(all=True, filters={"label": f"{OWNER_LABEL}={mine}"})
                if x["Id"] not in ids]
    except Exception as e:  # the engine went away: say so, keep going
        print(f"could not list this process's containers: {e}", file=sys.stderr)
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


def remove_orphans(c: docker.DockerClient) -> list[str]:
    """Remove the containers that a nodeforge process of this machine left when it was killed outright
    (SIGKILL, a power cut): those whose owner label names a process that no longer runs. Another
    machine's (a shared remote engine) are not this machine's to judge. Their short ids."""
    here = owner_labels()[OWNER_LABEL].split(" ")
    removed = []
    for x in c.api.containers(all=True, filters={"label": OWNER_LABEL}):
        owner = ((x.get("Labels") or {}).get(OWNER_LABEL) or "").split(" ")
        if len(owner) != 4 or owner[0] != here[0] or not owner[2].isdigit():
            continue
        if owner[1] == here[1] and owner_of(int(owner[2])) == " ".join(owner):
            continue  # its process still runs
        try:
            c.api.remove_container(x["Id"], force=True, v=True)
            removed.append(x["Id"][:12])
        except docker.errors.NotFound:
            pass
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
            _wait_for_lock(f)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _wait_for_lock(f: Any) -> None:
    """Block until the lock is ours, or raise Cancelled when the build is stopped meanwhile."""
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            cancel.pause(0.2)


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


# the engine calls an error can come from, for its message: (method, path under the API version, what it is)
_OPERATIONS = (
    ("GET", r"/_ping|/version|/info", "the engine check"),
    ("GET", r"/images/json", "the image list"),
    ("GET", r"/images/.+/json", "an image inspect"),
    ("GET", r"/images/.+/get", "an image save"),
    ("POST", r"/images/.+/tag", "an image tag"),
    ("POST", r"/images/.+/push", "an image push"),
    ("DELETE", r"/images/.+", "an image removal"),
    ("POST", r"/images/(create|load)", "an image import"),
    ("POST", r"/build", "an image build"),
    ("POST", r"/commit", "a container commit"),
    ("POST", r"/containers/create", "a container create"),
    ("GET", r"/containers/json", "the container list"),
    ("GET", r"/containers/.+/(export|archive)", "a container export"),
    ("DELETE", r"/containers/.+", "a container removal"),
)


def _operation(method: str, url: str) -> str:
    path = re.sub(r"^/v[0-9.]+/", "/", urllib.parse.urlsplit(url).path.replace("%2F", "/")) or "/"
    for m, pattern, name in _OPERATIONS:
        if m == method and re.fullmatch(pattern, path):
            return f"{name} ({method} {path})"
    return f"{method} {path}"


def engine_problem(e: BaseException) -> EnvironmentProblem | None:
    """An engine call that failed (the engine answered an error, went away or is not an engine) as
    the error a user can act on: which call, which engine, what to do; None for any other error."""
    import requests
    import urllib3

    if not isinstance(e, docker.errors.DockerException | requests.RequestException | urllib3.exceptions.HTTPError):
        return None
    request: Any = getattr(getattr(e, "response", None), "request", None) or getattr(e, "request", None)
    what = _operation(str(request.method), str(request.url)) if getattr(request, "url", None) else "a call"
    detail = f"{type(e).__name__}: {e}"
    if isinstance(e, docker.errors.APIError) and e.explanation:
        detail = f"{e.status_code}: {e.explanation}"
    detail = " ".join(str(detail).split())[:300]
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock (DOCKER_HOST is not set)"
    return EnvironmentProblem(f"the Docker Engine at {where} failed {what}: {detail}; check that DOCKER_HOST names "
                              "a working Docker Engine (`docker info` with the same DOCKER_HOST) and run it again")
