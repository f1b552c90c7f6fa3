"""Done records: what a finished `nodeforge build` made, so that the same build with nothing changed
answers at once, without the engine client, the pipeline or a single engine step (issue: a no-op
under half a second).

A record is named by everything the build's outputs depend on: the images asked for, their plan
keys (every definition, lock entry and parent is in them), the config, the --set values, --format,
the revision and origin the OCI labels carry, the engine namespace and build directory, and
nodeforge's own code (its files' sizes and times). It holds what the build left: every engine tag
with its image id, every file under the images' output directories with its size and time, and the
summary the build printed. It is taken only when all of that still holds: each tag is asked of the
engine with one GET on its socket (an image removed or retagged since is a miss), each file stat'ed
(a disk removed or touched is a miss). Anything the fast path cannot see through is never taken:
offline builds, --secret, a plan its lock files do not fully pin (the build resolves it
under build/resolved/), an engine that is not a local socket; and a --locked build, which resolves again by definition,
is never answered from a record (it writes one)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.parse
from pathlib import Path
from typing import Any

from .paths import build_dir, namespace
from .plan import BuildPlan, digest

FORMAT = 1
CODE = Path(__file__).resolve().parent
SOCKET = "/var/run/docker.sock"


def _code_stamp() -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(CODE)), st.st_size, st.st_mtime_ns)
                  for p in CODE.rglob("*") if p.suffix in (".py", ".sh", ".j2", ".txt") and (st := p.stat()))


def key(root: Path, images: list[str], plans: list[BuildPlan], config: str | None, sets: list[str],
        formats: list[str] | None, revision: str, source: str) -> str:
    return digest({"format": FORMAT, "images": images, "plans": [[p.image, p.key, list(p.tags)] for p in plans],
                   "config": config, "sets": sets, "formats": formats, "revision": revision, "source": source,
                   "namespace": namespace(), "build_dir": str(build_dir(root)), "code": _code_stamp()})


def eligible(plans: list[BuildPlan]) -> bool:
    """Whether a record can stand for a build of these plans, online and without secrets (--locked:
    it can, but is never replayed: a --locked build resolves again by definition; what it leaves is
    the plain build's)."""
    if not _socket_path():
        return False
    return all(all(s.locked for s in p.steps) and (p.install is None or p.install.locked) for p in plans)


def path_for(root: Path, record_key: str) -> Path:
    return build_dir(root) / "done" / f"{record_key[:32]}.json"


def _socket_path() -> str | None:
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return SOCKET
    return host.removeprefix("unix://") if host.startswith("unix://") else None


def _files(outputs: list[Path]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for d in outputs:
        for p in sorted(d.rglob("*")) if d.is_dir() else []:
            if p.is_file():
                st = p.stat()
                found[str(p)] = [st.st_size, st.st_mtime_ns]
    return found


def write(root: Path, record_key: str, tags: dict[str, str], outputs: list[Path], summary: list[str]) -> None:
    """After a build that finished: its tags (tag -> image id), the files of its output directories."""
    path = path_for(root, record_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "key": record_key, "tags": tags, "files": _files(outputs),
                               "summary": summary}, indent=1) + "\n")
    tmp.replace(path)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=5)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self.socket_path)


def _image_ids(tags: list[str]) -> dict[str, str | None]:
    """tag -> the engine's image id for it now (None: not there), over one connection."""
    path = _socket_path()
    assert path is not None
    conn = _UnixConnection(path)
    out: dict[str, str | None] = {}
    try:
        for tag in tags:
            conn.request("GET", f"/images/{urllib.parse.quote(tag, safe='')}/json")
            resp = conn.getresponse()
            body = resp.read()
            out[tag] = json.loads(body).get("Id") if resp.status == 200 else None
    finally:
        conn.close()
    return out


def replay(root: Path, record_key: str) -> list[str] | None:
    """The summary of the recorded build when everything it made is as it left it; else None."""
    path = path_for(root, record_key)
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if record.get("format") != FORMAT or record.get("key") != record_key:
        return None
    files = record.get("files") or {}
    for name, (size, mtime) in files.items():
        try:
            st = os.stat(name)
        except OSError:
            return None
        if (st.st_size, st.st_mtime_ns) != (size, mtime):
            return None
    tags: dict[str, str] = record.get("tags") or {}
    try:
        if _image_ids(list(tags)) != tags:
            return None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    summary: list[str] = record.get("summary") or []
    return summary
