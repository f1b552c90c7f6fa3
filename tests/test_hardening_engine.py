"""Faults and writers against the real engine (issue 9), with a tiny imported image (one file, no
registry pull): pushes to a registry that is not there or fails mid-push retry, name the registry and
leave no tag behind; an interrupt removes the containers this process made and no other; the
Dockerfile ENV and LABEL words arrive in the image exactly as written."""

from __future__ import annotations

import io
import socket
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import docker
import pytest

from builder import publish
from builder.engine import client as engine
from builder.errors import BuildFailed

TINY = "nodeforge-test/hardening-tiny:1"


@pytest.fixture(scope="module")
def tiny(docker_client: docker.DockerClient) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"hello from a one-file image\n"
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mtime = len(data), 1700000000
        tar.addfile(info, io.BytesIO(data))
    repo, tag = TINY.split(":")
    docker_client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=tag)
    return TINY


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tags(c: docker.DockerClient) -> set[str]:
    return {t for image in c.images.list() for t in image.tags}


def test_push_to_an_unreachable_registry_retries_then_names_it(docker_client: docker.DockerClient, tiny: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "RETRY_DELAYS", (0.0, 0.0))
    registry = f"127.0.0.1:{_free_port()}"  # nothing listens there
    c = engine.client()
    with pytest.raises(BuildFailed) as e:
        publish.push(c, [("tiny", (tiny,))], registry)
    assert f"registry {registry}: push of {tiny}" in str(e.value) and "failed 3 times" in str(e.value)
    assert not [t for t in _tags(c) if t.startswith(registry)]  # nothing half-tagged


class FailingRegistry(BaseHTTPRequestHandler):
    """Answers the version check like a registry, then fails every blob upload: a push that starts
    and breaks in the middle."""

    uploads = 0

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _reply(self, code: int, body: bytes = b"{}") -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._reply(200 if self.path.rstrip("/") == "/v2" else 404)

    def do_HEAD(self) -> None:
        self._reply(404)

    def do_POST(self) -> None:
        type(self).uploads += 1
        self._reply(500, b'{"errors":[{"code":"UNKNOWN","message":"storage failed"}]}')

    do_PUT = do_PATCH = do_POST


@pytest.fixture()
def failing_registry() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FailingRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FailingRegistry.uploads = 0
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_push_failing_mid_way_retries_and_leaves_no_tag(docker_client: docker.DockerClient, tiny: str,
                                                        failing_registry: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "RETRY_DELAYS", (0.0, 0.0))
    c = engine.client()
    with pytest.raises(BuildFailed) as e:
        publish.push(c, [("tiny", (tiny,))], failing_registry)
    assert f"registry {failing_registry}" in str(e.value) and "failed 3 times" in str(e.value)
    assert FailingRegistry.uploads >= 3  # it got as far as uploading, three times
    assert not [t for t in _tags(c) if t.startswith(failing_registry)]


def test_a_good_push_leaves_no_registry_tag(docker_client: docker.DockerClient, tiny: str, registry: str) -> None:
    c = engine.client()
    (pushed,) = publish.push(c, [("tiny", (tiny,))], registry)
    assert pushed.digest.startswith("sha256:") and pushed.tag == f"{registry}/{tiny}"
    assert not [t for t in _tags(c) if t.startswith(registry)]


def test_interrupt_cleanup_removes_only_this_process_containers(docker_client: docker.DockerClient,
                                                                tiny: str) -> None:
    c = engine.client()
    mine = c.containers.create(tiny, command=["/hello.txt"], labels={engine.SESSION_LABEL: "hardening"})
    other = docker.from_env().containers.create(tiny, command=["/hello.txt"])  # not through engine.client()
    assert mine.id and other.id
    try:
        removed = engine.remove_throwaway_containers()
        assert mine.id[:12] in removed
        with pytest.raises(docker.errors.NotFound):
            c.containers.get(mine.id)
        assert c.containers.get(other.id).id == other.id
    finally:
        other.remove(force=True)


def test_dockerfile_env_and_label_arrive_as_written(docker_client: docker.DockerClient, tiny: str,
                                                    tmp_path: Path) -> None:
    from builder.engine.dockerfile import fragment, label_fragment
    from builder.plan import LayerStep

    nasty = "a $HOME b'c \"d\" ${X:-y} \\n é"
    step = LayerStep("w", "summary", "k" * 64, (), "", (("V", nasty), ("W", "plain")), (), True)
    (tmp_path / "Dockerfile").write_text(f"FROM {tiny}\n" + fragment(step, ".") + label_fragment({"org.x": nasty}))
    image, _ = docker_client.images.build(path=str(tmp_path), tag="nodeforge-test/hardening-env:1", rm=True)
    assert image.id
    try:
        config = docker_client.api.inspect_image(image.id)["Config"]
        assert f"V={nasty}" in config["Env"] and "W=plain" in config["Env"]
        assert config["Labels"]["org.x"] == nasty
    finally:
        docker_client.images.remove(image.id, force=True)
