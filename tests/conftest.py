"""Shared fixtures. Expensive images are built once per test session and shared."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")


def engine_available() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def docker_client():  # type: ignore[no-untyped-def]
    if not engine_available():
        pytest.fail("no Docker Engine answers: run `make setup` (make test does)")
    from builder import engine

    return engine.client()


@pytest.fixture(scope="session")
def tree():  # type: ignore[no-untyped-def]
    from builder.load import load_tree

    return load_tree(ROOT)


@pytest.fixture(scope="session")
def built_gpu_node(docker_client):  # type: ignore[no-untyped-def]
    """images/gpu-node.yaml with configs/default.yaml, built once (cached by key across runs)."""
    from builder.build import Builder
    from builder.engine import Progress
    from builder.load import load_tree

    builder = Builder(load_tree(ROOT), "default", [], Progress())
    (result,) = builder.build(["gpu-node"])
    return result


@pytest.fixture
def scratch_tree(tmp_path: Path) -> Iterator[Path]:
    """A copy of the project's definitions (layers, images, configs) to change freely."""
    for d in ("layers", "images", "configs"):
        shutil.copytree(ROOT / d, tmp_path / d)
    yield tmp_path
