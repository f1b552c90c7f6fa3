"""Container builds through the engine: per-layer cache by key, image DAG, labels, lock, render."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import docker
import pytest

from builder import lockfile
from builder.definitions.load import load_tree
from builder.pipeline import Builder, BuildResult
from builder.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
TINY = """name: {name}
summary: a small container image for build tests
kind: container
version: "1.0"
from:
  debian: {{suite: bookworm, components: [main, contrib, non-free, non-free-firmware]}}
source-date-epoch: 1735689600
layers: [base, t1, t2, t3]
outputs: {{tags: ["nodeforge-test/{name}:1.0"]}}
"""


def small_layer(name: str, text: str) -> str:
    return (f"name: {name}\nsummary: writes one file\nfiles:\n  - {{path: /etc/{name}.txt, source: {name}.txt}}\n"
            f"tests:\n  - name: {name} file\n    file: {{path: /etc/{name}.txt, content: {{equals: '{text}'}}}}\n")


@pytest.fixture(scope="module")
def tiny_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("tiny")
    for d in ("layers", "configs"):
        shutil.copytree(ROOT / d, t / d)
    (t / "images").mkdir()
    for n in ("t1", "t2", "t3"):
        (t / "layers" / n / "files").mkdir(parents=True)
        (t / "layers" / n / "layer.yaml").write_text(small_layer(n, n))
        (t / "layers" / n / "files" / f"{n}.txt").write_text(n)
    (t / "images" / "tiny.yaml").write_text(TINY.format(name="tiny"))
    (t / "images" / "tiny-child.yaml").write_text(
        "name: tiny-child\nsummary: builds on tiny\nkind: container\nfrom: {image: tiny}\n"
        "layers: [child]\noutputs: {tags: ['nodeforge-test/tiny-child:1.0']}\n")
    (t / "layers" / "child" / "files").mkdir(parents=True)
    (t / "layers" / "child" / "files" / "child.txt").write_text("child")
    (t / "layers" / "child" / "layer.yaml").write_text(small_layer("child", "child").replace(
        "summary: writes one file\n", "summary: writes one file\nenv: {CHILD: 'yes'}\n"))
    return t


def build(tree: Path, *images: str, jobs: int = 1, locked: bool = False) -> list[BuildResult]:
    return Builder(load_tree(tree), None, [], Progress(quiet=True), locked=locked).build(list(images), jobs=jobs)


def statuses(result: BuildResult) -> dict[str, str]:
    return {s.layer: s.status for s in result.steps}


def test_second_build_rebuilds_nothing(docker_client: docker.DockerClient, tiny_tree: Path) -> None:
    build(tiny_tree, "tiny")
    (again,) = build(tiny_tree, "tiny")
    assert set(statuses(again).values()) == {"cached"}


def test_base_carries_nothing_of_the_build_host(tiny_tree: Path) -> None:
    """mmdebstrap copies the host's resolv.conf and hostname in; the bootstrap drops them, so the base
    layer (and every OCI digest above it) is the same on any build host."""
    import tarfile

    from builder.engine.bootstrap import tarball

    plan = Builder(load_tree(tiny_tree), None, [], Progress(quiet=True)).plan("tiny")
    with tarfile.open(tarball(plan.base, Progress(quiet=True), "tiny")) as tar:
        names = {n.removeprefix("./") for n in tar.getnames()}
    assert "etc/apt/sources.list" in names  # the bootstrapped tree itself
    assert not names & {"etc/resolv.conf", "etc/hostname"}


def test_changing_one_file_rebuilds_that_layer_and_those_after(docker_client: docker.DockerClient,
                                                               tiny_tree: Path) -> None:
    (first,) = build(tiny_tree, "tiny")
    changed = f"t2 changed {uuid.uuid4().hex}"  # a content this engine has never built
    (tiny_tree / "layers" / "t2" / "files" / "t2.txt").write_text(changed)
    (tiny_tree / "layers" / "t2" / "layer.yaml").write_text(small_layer("t2", changed))
    try:
        (second,) = build(tiny_tree, "tiny")
        # the package phase first (nothing changed in it), then one step per layer
        assert statuses(second) == {"packages": "cached", "base": "cached", "t1": "cached", "t2": "built",
                                    "t3": "built"}
        assert second.steps[3].reason == "changed: files /etc/t2.txt"
        assert second.steps[4].reason == "changed: after layer t2"
        assert cat(second.ref, "/etc/t2.txt") == changed
        assert first.steps[2].key == second.steps[2].key and first.steps[3].key != second.steps[3].key
    finally:
        (tiny_tree / "layers" / "t2" / "files" / "t2.txt").write_text("t2")
        (tiny_tree / "layers" / "t2" / "layer.yaml").write_text(small_layer("t2", "t2"))


def test_labels_and_image_dag(docker_client: docker.DockerClient, tiny_tree: Path) -> None:
    parent, child = build(tiny_tree, "tiny-child", jobs=2)
    assert (parent.image, child.image) == ("tiny", "tiny-child")
    labels = docker_client.images.get(child.ref).labels
    assert labels["org.opencontainers.image.created"] == "2025-01-01T00:00:00Z"
    assert labels["org.opencontainers.image.version"] == "0.0.0"
    assert labels["org.opencontainers.image.base.name"] == "nodeforge-test/tiny:1.0"
    assert labels["org.opencontainers.image.base.digest"] == parent.id
    assert [x["name"] for x in json.loads(labels["io.nodeforge.layers"])] == ["child"]
    assert cat(child.ref, "/etc/t1.txt", "/etc/child.txt") == "t1child"
    env = docker_client.images.get(child.ref).attrs["Config"]["Env"]
    assert "CHILD=yes" in env


def test_independent_images_build_in_parallel(docker_client: docker.DockerClient, tiny_tree: Path) -> None:
    (tiny_tree / "images" / "tiny-b.yaml").write_text(TINY.format(name="tiny-b"))
    try:
        results = build(tiny_tree, "tiny", "tiny-b", jobs=2)
        assert [r.image for r in results] == ["tiny", "tiny-b"]
        assert results[0].steps[-1].key == results[1].steps[-1].key  # same content, shared cache
        assert docker_client.images.get("nodeforge-test/tiny-b:1.0").id == results[1].id
    finally:
        (tiny_tree / "images" / "tiny-b.yaml").unlink()


def test_lock_pins_versions_and_locked_refuses_drift(docker_client: docker.DockerClient, tiny_tree: Path) -> None:
    lock_file = tiny_tree / "images" / "tiny.lock"
    lock_file.unlink(missing_ok=True)
    build(tiny_tree, "tiny")  # a build never writes a lock file: what it resolved stays under build/
    assert not lock_file.exists()
    assert "ca-certificates:" in lockfile.resolved_path(tiny_tree, "tiny").read_text()
    wrote = run_cli(tiny_tree, "lock", "tiny")
    assert wrote.returncode == 0 and "wrote images/tiny.lock" in wrote.stdout, wrote.stderr
    text = lock_file.read_text()
    assert "ca-certificates:" in text
    from builder.compose import compose

    plan = compose(load_tree(tiny_tree), "tiny")
    assert any(p.startswith("ca-certificates=") for p in plan.steps[0].packages)
    ok = run_cli(tiny_tree, "build", "tiny", "--locked", "-q")
    assert ok.returncode == 0, ok.stderr
    version = next(line.split(":", 1)[1].strip() for line in text.splitlines() if "ca-certificates:" in line)
    lock_file.write_text(text.replace(f"ca-certificates: {version}", "ca-certificates: 0.0-bogus"))
    try:
        proc = run_cli(tiny_tree, "build", "tiny", "--locked", "-q")
        assert proc.returncode == 1
        assert "- base: ca-certificates 0.0-bogus" in proc.stderr
        assert f"+ base: ca-certificates {version}" in proc.stderr
        check = run_cli(tiny_tree, "lock", "tiny", "--check")
        assert check.returncode == 1 and "0.0-bogus" in check.stdout
    finally:
        lock_file.write_text(text)


def test_rendered_context_builds_with_plain_docker(docker_client: docker.DockerClient, tiny_tree: Path,
                                                   tmp_path: Path) -> None:
    (result,) = build(tiny_tree, "tiny")
    out = tmp_path / "ctx"
    proc = run_cli(tiny_tree, "render", "tiny", str(out))
    assert proc.returncode == 0, proc.stderr
    dockerfile = (out / "Dockerfile").read_text()
    assert "COPY 01-packages/root/ /" in dockerfile and "COPY 03-t1/root/ /" in dockerfile
    assert dockerfile.index("01-packages") < dockerfile.index("03-t1") and "# syntax" not in dockerfile
    assert (out / "bootstrap.sh").read_text().startswith("#!/bin/sh")
    base = result.plan.base
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    tag = "nodeforge-test/rendered:1"
    b = subprocess.run(["docker", "build", "-q", "--build-arg", f"BASE=nodeforge-base:{base.key}", "-t", tag,
                        str(out)], capture_output=True, text=True, env=env)
    assert b.returncode == 0, b.stderr
    assert cat(tag, "/etc/t3.txt") == "t3"
    docker_client.images.remove(tag, force=True)


def test_docker_host_is_honoured(tiny_tree: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "builder", "--root", str(tiny_tree), "build", "tiny"],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 2
    assert "unix:///nonexistent/docker.sock" in proc.stderr and "Traceback" not in proc.stderr


def test_node_minimal_image_is_built_with_oci_labels(built_node_minimal: BuildResult,
                                                     docker_client: docker.DockerClient) -> None:
    labels = docker_client.images.get(built_node_minimal.ref).labels
    for key in ("created", "revision", "source", "version", "base.name", "base.digest"):
        assert labels[f"org.opencontainers.image.{key}"]
    assert labels["io.nodeforge.key"] == built_node_minimal.plan.key


def cat(ref: str, *paths: str) -> str:
    return subprocess.run(["docker", "run", "--rm", ref, "cat", *paths], capture_output=True, text=True,
                          check=True).stdout


def run_cli(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", "--root", str(tree), *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_diff_between_two_builds(docker_client: docker.DockerClient, tiny_tree: Path,
                                 built_node_minimal: BuildResult) -> None:
    build(tiny_tree, "tiny")
    same = subprocess.run([sys.executable, "-m", "builder", "diff", built_node_minimal.ref, built_node_minimal.ref],
                          capture_output=True, text=True, cwd=ROOT)
    assert same.returncode == 0 and len(same.stdout.splitlines()) == 2
    proc = subprocess.run([sys.executable, "-m", "builder", "diff", "nodeforge-test/tiny:1.0", built_node_minimal.ref],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "+ vm.swappiness 1" in out and "+ iommu=pt" in out and "+ blacklist nouveau" in out
    assert "+ prometheus-node-exporter " in out
    assert "multi-user.target.wants/prometheus-node-exporter.service" in out
    assert "+ etc/default/prometheus-node-exporter 0644/" in out
