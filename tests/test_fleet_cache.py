"""The fleet cache (builder.fleetcache) against a real registry and two real engines: engine A (this
machine's) pushes what it built, signed; engine B (a second dockerd with its own data root and
bridge, empty) builds the same image without running one engine step, bit-identical; a tampered
entry is refused and rebuilt; a registry that goes down mid-build, or is not there, never fails a
build that can succeed locally, unless --cache-required."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from support.keys import ed25519_pair
from support.registry import local_registry
from support.second_engine import second_engine

from builder.fleetcache.cache import SharedCache, entry_name, statement
from builder.fleetcache.registry import Location
from builder.fleetcache.signature import PublicKey, SigningKey
from builder.progress import Progress

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parent.parent
NODE = ["node-minimal", "-c", "default"]
STEP_LINE = re.compile(r"layer \d+/\d+ (\S+)\s+(cached|pulled|built)\s+[\d.]+s\s+([0-9a-f]{12})")


def _build(args: list[str], build_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", "build", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "NODEFORGE_BUILD_DIR": str(build_dir),
                               **env}, timeout=1800)


def _output_dir(build_dir: Path) -> Path:
    (found,) = [d for d in (build_dir / "images").iterdir() if d.name.startswith("node-minimal")]
    return found


def _outputs(build_dir: Path) -> dict[str, str]:
    return dict(json.loads(_output_dir(build_dir).joinpath("node.json").read_text())["sha256"])


def _digest(build_dir: Path) -> str:
    data = json.loads(_output_dir(build_dir).joinpath("manifest.json").read_text())
    return str(data["image_digest"])


class Fleet:
    def __init__(self, tmp: Path, registry: str) -> None:
        self.tmp, self.cache = tmp, f"{registry}/fleet"
        self.key, self.pub = ed25519_pair(tmp, "fleet")
        self.a = tmp / "a"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A registry, a key pair, and node-minimal built on engine A with the cache: every entry pushed."""
    tmp = tmp_path_factory.mktemp("fleet")
    (tmp / "registry").mkdir()
    with open(tmp / "registry.log", "w") as log, local_registry(tmp / "registry", log) as registry:
        f = Fleet(tmp, registry)
        p = _build([*NODE, "--cache", f.cache, "--secret", f"cache-signing={f.key}"], f.a)
        assert p.returncode == 0, p.stderr[-3000:]
        pushed = re.search(r"cache \S+: \d+ pulled \([\d.]+ MB\), (\d+) pushed", p.stderr)
        assert pushed and int(pushed.group(1)) >= 7, p.stderr[-2000:]  # base, five layers, initramfs, labels
        yield f
    shutil.rmtree(tmp, ignore_errors=True)  # the registry's blobs and three build directories


def _on(engine: str, f: Fleet, build_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _build([*NODE, "--cache", f.cache, "--cache-public-key", str(f.pub), *extra], build_dir,
                  DOCKER_HOST=engine, NODEFORGE_CACHE=str(build_dir / "host-cache"))


def test_engine_b_builds_what_a_pushed_without_one_engine_step(fleet: Fleet, tmp_path: Path) -> None:
    b = tmp_path / "b"
    with second_engine(tmp_path) as engine:
        p = _on(engine, fleet, b)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "building" not in p.stderr and "generating" not in p.stderr, p.stderr
        assert re.search(r"base debian bookworm \S+\s+pulled", p.stderr), p.stderr
        assert not list((b / "logs").rglob("*.log")), "an engine step ran on engine B"
        steps = STEP_LINE.findall(p.stderr)
        assert steps and {s[1] for s in steps} == {"pulled"}, steps
        assert re.search(r"cache \S+: \d+ pulled \([\d.]+ MB\), 0 pushed", p.stderr)
        assert _outputs(b) == _outputs(fleet.a)  # disks, netboot: the same bytes
        assert _digest(b) == _digest(fleet.a)
        tag = subprocess.run(["docker", "-H", engine, "image", "inspect", "-f", "{{.Id}}",
                              "nodeforge/node-minimal:0.1.0"], capture_output=True, text=True).stdout.strip()
        here = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", "nodeforge/node-minimal:0.1.0"],
                              capture_output=True, text=True).stdout.strip()
        assert tag and tag == here  # the final engine image too: the same id on both engines


def _steped25519_pair(build_dir: Path) -> dict[str, str]:
    """layer -> its full step key, from the build's fingerprints."""
    state = json.loads(next((build_dir / "state").glob("node-minimal*.json")).read_text())
    return {layer: fp["key"] for layer, fp in state.items()}


def test_a_tampered_entry_is_refused_and_rebuilt_and_the_result_is_the_same(
        fleet: Fleet, tmp_path: Path, docker_client: docker.DockerClient) -> None:
    keys = _steped25519_pair(fleet.a)
    location = Location.parse(fleet.cache)
    # the attack: other content under the monitoring step's key (the base image, pushed by this engine)
    poisoned = entry_name("step", keys["monitoring"])
    base = next(t for i in docker_client.images.list() for t in i.tags if t.startswith("nodeforge-base:"))
    docker_client.api.tag(base, str(location), poisoned)
    try:
        for chunk in docker_client.api.push(str(location), tag=poisoned, stream=True, decode=True):
            assert "error" not in chunk, chunk
    finally:
        docker_client.api.remove_image(f"{location}:{poisoned}")
    # and the right content under the kernel-args key, signed by a key that is not the fleet's
    other_key, _ = ed25519_pair(tmp_path, "other")
    forged = SharedCache(location, Progress(quiet=True), signing=SigningKey.load(other_key))
    kernel_args = entry_name("step", keys["kernel-args"])
    forged.store(docker_client, f"nodeforge-cache:{keys['kernel-args']}", kernel_args, "node-minimal")
    assert forged.figures.pushed == 1 and not forged.down
    c = tmp_path / "c"
    with second_engine(tmp_path) as engine:
        p = _on(engine, fleet, c)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"entry {poisoned[:24]} refused (its content is not what was signed" in p.stderr
    assert f"entry {kernel_args[:24]} refused (its signature does not verify against {fleet.pub}" in p.stderr
    steps = {layer: status for layer, status, _ in STEP_LINE.findall(p.stderr)}
    assert steps["monitoring"] == "built" and steps["kernel-args"] == "built"
    assert steps["base"] == "pulled" and steps["packages"] == "pulled"
    assert _outputs(c) == _outputs(fleet.a)
    assert _digest(c) == _digest(fleet.a)


class _DiesAfter(http.server.BaseHTTPRequestHandler):
    """A proxy to the registry that goes down (closes every connection, answers nothing) at the
    second signature lookup: the base came from the cache, the rest of the build finds it down.
    With `stall` set it answers that lookup only after `stall` seconds instead (a slow registry)."""

    upstream = ""
    lookups = 0
    die_at = 2  # the signature lookup it goes down (or stalls) at; 0: never
    stall = 0.0
    dead = threading.Event()

    def _forward(self) -> None:
        if self.path.endswith(".sig") and "/manifests/" in self.path:
            type(self).lookups += 1
            if self.die_at and type(self).lookups >= self.die_at:
                if self.stall:
                    time.sleep(self.stall)
                else:
                    type(self).dead.set()
        if type(self).dead.is_set():
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        conn = http.client.HTTPConnection(self.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn.request(self.command, self.path, body=body, headers=headers)
        answer = conn.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for k, v in answer.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = _forward

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("stall, says", [(0.0, "Connection reset|Remote end closed|refused|EOF|reset by peer"),
                                         (15.0, "timed out")], ids=["down", "slow"])
def test_a_registry_down_or_slow_mid_build_leaves_the_build_to_finish_locally_with_a_warning(
        fleet: Fleet, tmp_path: Path, stall: float, says: str) -> None:
    _DiesAfter.upstream, _DiesAfter.stall, _DiesAfter.lookups = fleet.cache.split("/")[0], stall, 0
    _DiesAfter.dead.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DiesAfter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = f"127.0.0.1:{server.server_address[1]}/fleet"
    try:
        # container-base in a namespace of its own: its base from the cache (pushed first), then the registry is gone
        env = {"NODEFORGE_CACHE_NAMESPACE": f"fleetdown{os.getpid()}"}
        pushed = _build(["container-base", "--cache", fleet.cache, "--secret", f"cache-signing={fleet.key}"],
                        tmp_path / "push", **env)
        assert pushed.returncode == 0, pushed.stderr[-2000:]
        p = _build(["container-base", "--cache", proxy, "--cache-public-key", str(fleet.pub)], tmp_path / "down",
                   NODEFORGE_CACHE_NAMESPACE=f"fleetdown2{os.getpid()}")
        assert _DiesAfter.lookups >= 2 and _DiesAfter.dead.is_set() == (not stall)
        assert p.returncode == 0, p.stderr[-3000:]
        assert re.search(rf"warning: cache {re.escape(proxy)}: registry 127.0.0.1:\d+: GET /v2/fleet/manifests/step-"
                         rf"[0-9a-f]+\.sig: .*({says}).*; the build goes on locally", p.stderr), p.stderr
        assert "base debian bookworm minbase      pulled" in p.stderr
        assert p.stderr.count("warning: cache") == 1  # one warning, then the cache is left alone
        assert [s[1] for s in STEP_LINE.findall(p.stderr)] == ["built", "built"]
    finally:
        server.shutdown()
        for ns in (f"fleetdown{os.getpid()}", f"fleetdown2{os.getpid()}"):
            from support.engine import remove_namespace
            remove_namespace(ns)


class _Full(_DiesAfter):
    """A registry that is full: reads answer, every upload (POST, PUT, PATCH) is HTTP 507."""

    die_at = 0
    dead = threading.Event()

    def _refuse(self) -> None:
        self.send_response(507, "Insufficient Storage")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_PATCH = _refuse


def test_a_full_registry_leaves_the_push_undone_and_the_build_done(fleet: Fleet, tmp_path: Path) -> None:
    _Full.upstream = fleet.cache.split("/")[0]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Full)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = f"127.0.0.1:{server.server_address[1]}/fleet"
    namespace = f"fleetfull{os.getpid()}"
    try:
        p = _build(["container-base", "--cache", proxy, "--secret", f"cache-signing={fleet.key}"], tmp_path / "b",
                   NODEFORGE_CACHE_NAMESPACE=namespace)
    finally:
        server.shutdown()
        from support.engine import remove_namespace
        remove_namespace(namespace)
    assert p.returncode == 0, p.stderr[-3000:]
    assert re.search(rf"warning: cache {re.escape(proxy)}: .*(507|Insufficient Storage).*; the build goes on locally",
                     p.stderr), p.stderr
    assert re.search(r"cache \S+: 0 pulled \([\d.]+ MB\), 0 pushed", p.stderr)


def test_cache_required_makes_an_unreachable_registry_an_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, pub = ed25519_pair(tmp_path, "k")
    p = _build(["container-base", "--cache", f"127.0.0.1:{port}/fleet", "--cache-public-key", str(pub),
                "--cache-required"], tmp_path / "b", NODEFORGE_CACHE_NAMESPACE=f"fleetreq{os.getpid()}")
    assert p.returncode != 0
    assert f"registry 127.0.0.1:{port}" in p.stderr and "--cache-required: the build stops" in p.stderr
    from support.engine import remove_namespace
    remove_namespace(f"fleetreq{os.getpid()}")


def test_an_entry_whose_push_broke_off_is_a_miss_not_an_entry(fleet: Fleet, docker_client: docker.DockerClient,
                                                               tmp_path: Path) -> None:
    """The image pushed, its signature never: a reader takes it for absent (no pull, no refusal)."""
    location = Location.parse(fleet.cache)
    entry = entry_name("step", "0" * 64)
    base = next(t for i in docker_client.images.list() for t in i.tags if t.startswith("nodeforge-base:"))
    docker_client.api.tag(base, str(location), entry)
    try:
        for chunk in docker_client.api.push(str(location), tag=entry, stream=True, decode=True):
            assert "error" not in chunk
    finally:
        docker_client.api.remove_image(f"{location}:{entry}")
    reader = SharedCache(location, Progress(quiet=True), PublicKey.load(fleet.pub))
    assert reader.fetch(docker_client, f"nodeforge-cache-fleettest:{'0' * 64}", entry, "x") is False
    assert reader.figures.pulled == 0 and not reader.figures.refused and not reader.down
    assert statement(entry, "sha256:" + "1" * 64) == (b'{"entry":"' + entry.encode() + b'","image":"sha256:'
                                                     + b"1" * 64 + b'","nodeforge-cache":1}')


@pytest.mark.parametrize("args, says", [
    (["--cache", "http://x/y"], "--cache 'http://x/y': expected host[:port]/repository"),
    (["--cache", "127.0.0.1:5000"], "expected host[:port]/repository"),
    (["--cache-public-key", "/nonexistent"], "are for a fleet cache: give --cache REGISTRY/REPO"),
    (["--cache", "127.0.0.1:5000/c", "--cache-public-key", "/etc/hostname"], "not an Ed25519 public key in PEM"),
    (["--cache", "127.0.0.1:5000/c", "--secret", "cache-signing=/etc/hostname"], "not an unencrypted PEM private key"),
])
def test_bad_cache_arguments_exit_2(args: list[str], says: str, tmp_path: Path) -> None:
    p = _build(["container-base", *args], tmp_path / "b")
    assert p.returncode == 2, p.stderr
    assert says in p.stderr
