"""Faults of a running build (issue 21): Ctrl-C and SIGTERM stop it promptly and leave nothing (a
build waiting for its lock does not begin; a long engine step is stopped and its container goes);
an engine that answers errors outside the build step gives one clear line and exit 2, never a
traceback; a build killed outright (SIGKILL) leaves assembly directories, mounts and holder
containers that the next build removes. The first tests need no engine (a fake engine on
127.0.0.1 where one answers); those marked engine build through the real one."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import docker
import pytest

from builder.engine import cancel
from builder.engine import client as engine
from builder.node import assemble

ROOT = Path(__file__).resolve().parent.parent


class Build:
    """`nodeforge build` in a subprocess of its own session; its stderr read line by line as it comes."""

    def __init__(self, root: Path, build_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, "NODEFORGE_BUILD_DIR": str(build_dir), **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "builder", "--root", str(root), "build", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
                                     cwd=ROOT, start_new_session=True)
        self.lines: list[str] = []
        self.out = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._out_reader = threading.Thread(target=self._read_out, daemon=True)
        self._out_reader.start()

    def _read(self) -> None:
        assert self.proc.stderr
        for line in self.proc.stderr:
            self.lines.append(line)

    def _read_out(self) -> None:
        assert self.proc.stdout
        self.out = self.proc.stdout.read()

    def wait_for(self, *texts: str, timeout: float) -> None:
        """Until a line of stderr holds every one of texts."""
        deadline = time.monotonic() + timeout
        while not any(all(t in line for t in texts) for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"never printed {texts!r} (exit {self.proc.returncode}):\n{self.stderr}")
            time.sleep(0.1)

    def stopped_within(self, signum: int, seconds: float) -> float:
        """Send signum; how long the process took to exit (fails past seconds)."""
        start = time.monotonic()
        self.proc.send_signal(signum)
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"still running {seconds}s after signal {signum}:\n{self.stderr}")
        self._reader.join(5)
        return time.monotonic() - start

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    @property
    def stderr(self) -> str:
        return "".join(self.lines)


def held_lock(build_dir: Path, image: str) -> Any:
    """The build lock of image, taken as a build in another process would hold it."""
    (build_dir / "locks").mkdir(parents=True, exist_ok=True)
    f = open(build_dir / "locks" / f"{image}.lock", "a+")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def owned_by(pid: int, containers: list[dict[str, Any]]) -> list[str]:
    """The containers whose owner label names process pid."""
    return [x["Id"][:12] for x in containers
            if ((x.get("Labels") or {}).get(engine.OWNER_LABEL) or "").split(" ")[2:3] == [str(pid)]]


# --- Ctrl-C and SIGTERM, without an engine: a build waiting for its lock ----------------------------

@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_build_waiting_for_its_lock_stops_at_once_and_never_begins(tmp_path: Path, signum: int) -> None:
    build_dir = tmp_path / "build"
    lock = held_lock(build_dir, "node-minimal")  # another build of it runs
    try:
        build = Build(ROOT, build_dir, "node-minimal", env={"TMPDIR": str(tmp_path)})
        build.wait_for("node-minimal: waiting for another build of it to finish", timeout=60)
        seconds = build.stopped_within(signum, 10)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    assert build.proc.returncode == 2, build.stderr
    assert seconds < 5, f"took {seconds:.1f}s to stop"
    assert "interrupted" in build.stderr and "Traceback" not in build.stderr
    time.sleep(0.5)  # the lock is free now: a build that had gone on would have begun
    assert sorted(p.name for p in build_dir.iterdir()) == ["locks"], "the build began after all"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("nodeforge-")] == []


def test_an_interrupt_removes_what_a_stopped_worker_left_and_starts_the_next_build_afresh(tmp_path: Path) -> None:
    left = tmp_path / ".node-minimal.assemble-x"
    left.mkdir()
    (left / "disk.raw").write_bytes(b"half")
    token = cancel.register(left)
    assert cancel.interrupted(lambda: ["abc123"]) == 2
    assert not left.exists()
    cancel.unregister(token)
    assert not cancel.CANCELLED.is_set()  # no worker ran: the flag is down again for this process


def test_a_container_is_not_created_once_the_build_is_stopped() -> None:
    created: list[dict[str, Any]] = []
    removed: list[str] = []

    class Api:
        def create_container(self, *args: Any, **kwargs: Any) -> dict[str, str]:
            created.append(kwargs)
            return {"Id": f"c{len(created)}"}

        def remove_container(self, cid: str, **kwargs: Any) -> None:
            removed.append(cid)

    class Client:
        api = Api()

    c: Any = Client()
    engine._track_containers(c)
    c.api.create_container("img", labels={"io.nodeforge.role": "assembly"})
    c.api.create_container("img")  # no labels (it is committed): none added
    assert created[0]["labels"][engine.OWNER_LABEL] == engine.owner_of(os.getpid())
    assert "labels" not in created[1]
    cancel.CANCELLED.set()
    try:
        with pytest.raises(cancel.Cancelled):
            c.api.create_container("img", labels={"x": "y"})
    finally:
        cancel.CANCELLED.clear()
    assert len(created) == 2 and removed == []


# --- what a killed build left: assembly directories and containers of a process that is gone -------

def test_the_next_build_removes_assembly_directories_no_build_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                    ) -> None:
    build_dir = tmp_path / "build"
    monkeypatch.setenv("NODEFORGE_BUILD_DIR", str(build_dir))
    images = build_dir / "images"
    for name in (".node-minimal.assemble-ab12", ".node-minimal.assemble-ab12.previous",
                 ".cuda-11.8-devel.assemble-cd34", ".gpu-node.assemble-ef56"):
        (images / name / "rootfs" / "etc").mkdir(parents=True)
        (images / name / "disk.raw").write_bytes(b"half-written")
    (images / "node-minimal").mkdir()  # a finished output is no stray
    lock = held_lock(build_dir, "gpu-node")  # a build of gpu-node assembles right now
    try:
        removed = assemble.remove_strays(tmp_path)
    finally:
        lock.close()
    assert sorted(removed) == ["images/.cuda-11.8-devel.assemble-cd34", "images/.node-minimal.assemble-ab12",
                               "images/.node-minimal.assemble-ab12.previous"]
    assert sorted(p.name for p in images.iterdir()) == [".gpu-node.assemble-ef56", "node-minimal"]


def test_containers_of_a_process_that_is_gone_are_removed_and_no_others() -> None:
    child = subprocess.Popen(["sleep", "30"])
    dead = engine.owner_of(child.pid)
    child.kill()
    child.wait()
    assert dead and engine.owner_of(child.pid) is None
    mine = engine.owner_of(os.getpid())
    assert mine
    machine, boot, _, _ = mine.split(" ")
    labels = {"dead": dead, "mine": mine, "other-machine": f"elsewhere {boot} {child.pid} 1",
              "earlier-boot": f"{machine} another-boot {os.getpid()} 1", "unlabelled": None}
    removed: list[str] = []

    class Api:
        def containers(self, all: bool, filters: dict[str, str]) -> list[dict[str, Any]]:
            assert all and filters == {"label": engine.OWNER_LABEL}
            return [{"Id": name, "Labels": {engine.OWNER_LABEL: v} if v else {}} for name, v in labels.items()]

        def remove_container(self, cid: str, force: bool, v: bool) -> None:
            removed.append(cid)

    class Client:
        api = Api()

    client: Any = Client()
    assert engine.remove_orphans(client) == ["dead", "earlier-boot"]
    assert removed == ["dead", "earlier-boot"]


# --- an engine that answers errors: one line, exit 2, for every command that speaks to it -----------

class FailingEngine(BaseHTTPRequestHandler):
    """Answers the version and ping checks like an engine, and 500 to everything else."""

    seen: ClassVar[list[str]] = []

    def _answer(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        path = self.path.split("?")[0]
        if path.endswith("/_ping"):
            body, status = b"OK", 200
        elif path.endswith("/version"):
            version = {"ApiVersion": "1.41", "Version": "20.10.24", "MinAPIVersion": "1.12"}
            body, status = json.dumps(version).encode(), 200
        else:
            body, status = json.dumps({"message": "fake engine: internal failure"}).encode(), 500
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if status != 200 or body != b"OK" else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = do_HEAD = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def failing_engine() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FailingEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def nodeforge(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", "--root", str(ROOT), *args], capture_output=True,
                          text=True, env={**os.environ, **env}, cwd=ROOT, timeout=120)


COMMANDS = [("build", "node-minimal"), ("test", "node-minimal"), ("diff", "nodeforge/a:1", "nodeforge/b:1"),
            ("push", "node-minimal", "--registry", "127.0.0.1:1")]


@pytest.mark.parametrize("args", COMMANDS, ids=[a[0] for a in COMMANDS])
def test_an_engine_answering_errors_gives_one_line_and_exit_2(failing_engine: str, tmp_path: Path,
                                                              args: tuple[str, ...]) -> None:
    proc = nodeforge(*args, env={"DOCKER_HOST": failing_engine, "NODEFORGE_BUILD_DIR": str(tmp_path / "build")})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert f"the Docker Engine at {failing_engine} failed " in line
    assert "500: fake engine: internal failure" in line and "DOCKER_HOST" in line
    assert not list(tmp_path.glob("build/images/.*"))


@pytest.mark.parametrize("args", COMMANDS[::2], ids=[a[0] for a in COMMANDS[::2]])
def test_a_socket_that_is_no_engine_gives_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...]) -> None:
    path = tmp_path / "other-service.sock"
    with socket.socket(socket.AF_UNIX) as s:  # another service: it greets in its own protocol and hangs up
        s.bind(str(path))
        s.listen()

        def serve() -> None:
            while True:
                try:
                    conn, _ = s.accept()
                except OSError:
                    return
                with conn:
                    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

        threading.Thread(target=serve, daemon=True).start()
        proc = nodeforge(*args, env={"DOCKER_HOST": f"unix://{path}", "NODEFORGE_BUILD_DIR": str(tmp_path / "build")})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert f"unix://{path}" in line


# --- with the engine ----------------------------------------------------------------------------------

SLOW_LAYER = """name: slow
summary: one step that takes minutes
applies-to: [container]
steps:
  - name: wait
    run: "echo nodeforge-slow-step-begins; sleep 300; echo {marker}"
"""
SLOW_IMAGE = """name: slow-test
summary: builds on container-base; its one layer sleeps
kind: container
from: {image: container-base}
layers: [slow]
outputs: {tags: ["nodeforge-test/slow-test:1"]}
"""


def _containers(c: docker.DockerClient) -> dict[str, dict[str, Any]]:
    return {x["Id"]: x for x in c.api.containers(all=True)}


def _gone(c: docker.DockerClient, before: set[str], seconds: float) -> list[str]:
    """The containers made since `before` that are still there after seconds (the engine removes a
    stopped build's container shortly after the client went away)."""
    deadline = time.monotonic() + seconds
    while True:
        left = [cid[:12] for cid in _containers(c) if cid not in before]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@pytest.mark.engine
def test_sigint_during_a_long_step_stops_the_build_and_its_container(docker_client: docker.DockerClient,
                                                                     scratch_tree: Path, tmp_path: Path) -> None:
    (scratch_tree / "layers" / "slow").mkdir()
    (scratch_tree / "layers" / "slow" / "layer.yaml").write_text(SLOW_LAYER.format(marker=uuid.uuid4().hex))
    (scratch_tree / "images" / "slow-test.yaml").write_text(SLOW_IMAGE)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    before = set(_containers(docker_client))
    build = Build(scratch_tree, tmp_path / "build", "slow-test", env={"TMPDIR": str(tmp)})
    try:
        build.wait_for("[slow-test] layer", " slow ", "building", timeout=600)
        deadline = time.monotonic() + 120
        while not any(x["State"] == "running" for cid, x in _containers(docker_client).items()
                      if cid not in before) and time.monotonic() < deadline:
            time.sleep(0.5)  # the step's container runs
        seconds = build.stopped_within(signal.SIGINT, 20)
    finally:
        build.kill()
    assert build.proc.returncode == 2, build.stderr
    assert seconds < 10, f"took {seconds:.1f}s to stop"
    assert "interrupted" in build.stderr and "Traceback" not in build.stderr
    assert _gone(docker_client, before, 20) == []
    assert owned_by(build.proc.pid, list(_containers(docker_client).values())) == []
    assert list(tmp.iterdir()) == []  # no build context left
    assert not list((tmp_path / "build").glob("images/.*assemble-*"))


@pytest.mark.engine
def test_a_build_killed_during_assembly_is_cleaned_up_by_the_next(docker_client: docker.DockerClient,
                                                                  tmp_path: Path) -> None:
    build_dir = tmp_path / "build"
    killed = Build(ROOT, build_dir, "node-minimal", "--format", "raw,netboot")
    try:
        killed.wait_for("assemble file system", timeout=900)
    finally:
        killed.kill()  # SIGKILL, to the whole process group (as a job's or an OOM kill)
    images = build_dir / "images"
    strays = list(images.glob(".node-minimal.assemble-*"))
    assert strays, killed.stderr
    mounted = "mounted" in killed.stderr
    assert not mounted or any(str(build_dir) in line for line in Path("/proc/self/mountinfo").read_text().splitlines())
    holders = owned_by(killed.proc.pid, list(_containers(docker_client).values()))
    assert not mounted or holders  # the holder of the mounted image

    again = Build(ROOT, build_dir, "node-minimal", "--format", "raw,netboot")
    assert again.proc.wait(timeout=1800) == 0, again.stderr
    again._out_reader.join(5)
    assert not list(images.glob(".*")), list(images.glob(".*"))
    assert str(build_dir) not in Path("/proc/self/mountinfo").read_text()
    assert owned_by(killed.proc.pid, list(_containers(docker_client).values())) == []
    assert "left by a build that was killed" in again.stderr
    out = images / "node-minimal"
    node = json.loads((out / "node.json").read_text())
    sums = {name: sha for sha, name in (line.split("  ") for line in (out / "SHA256SUMS").read_text().splitlines())}
    assert set(sums) == set(node["files"].values())
    for name, sha in sums.items():
        h = hashlib.sha256()
        with (out / name).open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        assert h.hexdigest() == sha, name
    shutil.rmtree(build_dir, ignore_errors=True)
