"""Shared fixtures. Expensive images are built once per test session and shared.

Tests that need a Docker Engine (every test using one of ENGINE_FIXTURES, or marked `engine`) carry
the `engine` marker: `make test-fast` deselects them, and without an engine they skip with the
reason instead of failing. `make test` starts the engine first, so there they all run."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from builder.definitions.load import Tree
from builder.pipeline import BuildResult

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")


# fixtures that need an engine; a test using one of them is an engine test
ENGINE_FIXTURES = {"docker_client", "built_node_minimal", "cuda_images", "registry", "checked", "tiny_tree",
                   "exported", "boot_report"}


@functools.cache
def engine_available() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("docker"):
            item.add_marker(pytest.mark.engine)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Engine tests selected: make room for them first (tests/support/disk.py)."""
    if any(i.get_closest_marker("engine") for i in session.items) and engine_available():
        from support.disk import make_room

        from builder.engine import client as engine

        problem = make_room(engine.client(), ROOT)
        if problem:
            pytest.exit(problem, returncode=2)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("engine") and not engine_available():
        pytest.skip("no Docker Engine answers (make test starts one; DOCKER_HOST selects a remote one)")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    if not engine_available():
        pytest.skip("no Docker Engine answers (make test starts one; DOCKER_HOST selects a remote one)")
    from builder.engine import client as engine

    return engine.client()


@pytest.fixture(scope="session")
def tree() -> Tree:
    from builder.definitions.load import load_tree

    return load_tree(ROOT)


@pytest.fixture(scope="session")
def built_node_minimal(docker_client: docker.DockerClient) -> BuildResult:
    """images/node-minimal.yaml with configs/default.yaml, built once (cached by key across runs)."""
    from builder.definitions.load import load_tree
    from builder.pipeline import Builder
    from builder.progress import Progress

    builder = Builder(load_tree(ROOT), "default", [], Progress())
    (result,) = builder.build(["node-minimal"])
    return result


# the CUDA images the suite verifies; building their parents too (container-base, each chain)
CUDA_IMAGES = ["cuda-11.8-devel", "cuda-12.9-runtime", "cuda-13.0-devel", "cupy-cuda12.9", "cuda-11.8-base-slim",
               "cuda-13.0-runtime-cublas", "cuda-13.0-runtime-cufft", "cuda-13.0-runtime-nccl",
               "cuda-12.9-cudnn-runtime", "cuda-13.0-cudnn-devel", "cuda-13.0-base-distroless",
               "cuda-13.0-devel-debian13", "cuda-12.9-runtime-debian13", "cuda-13.0-base-distroless-debian13"]


@pytest.fixture(scope="session")
def cuda_images(docker_client: docker.DockerClient) -> dict[str, BuildResult]:
    """Every CUDA image (base, runtime, devel of each version), built once per session: name -> BuildResult.
    The 11.8 toolkit and the 12.x/13.x math libraries are large: the first build takes minutes,
    later sessions find every layer cached by key."""
    from builder.definitions.load import load_tree
    from builder.pipeline import Builder
    from builder.progress import Progress

    builder = Builder(load_tree(ROOT), None, [], Progress())
    builder.build(CUDA_IMAGES, jobs=2)
    return dict(builder.results)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real registry (Debian's docker-registry) on 127.0.0.1, filesystem storage in a tmp dir: HOST:PORT."""
    from support.registry import local_registry

    if shutil.which("docker-registry") is None:
        pytest.fail("docker-registry is not installed: run `make setup`")
    d = tmp_path_factory.mktemp("registry")
    with open(d / "registry.log", "w") as log, local_registry(d, log) as registry:
        yield registry


@pytest.fixture
def scratch_tree(tmp_path: Path) -> Iterator[Path]:
    """A copy of the project's definitions (layers, images, configs) to change freely."""
    for d in ("layers", "images", "configs"):
        shutil.copytree(ROOT / d, tmp_path / d)
    yield tmp_path
