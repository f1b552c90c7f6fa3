"""Done records (builder.done): the same build with nothing changed answers from its record without
the engine client or the pipeline; any change it cannot see through is a miss and the pipeline
runs (a tag moved, an output touched, another --set, --locked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from builder.cli import main

IMAGE = "images/container-base.yaml"
TAG = "nodeforge/container-base:bookworm"
NOOP = "nothing changed since the build recorded in"


def _build(root: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, str]:
    assert main(["build", str(root / IMAGE), *extra]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_a_second_build_answers_from_its_record_without_the_engine_client(root: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    first, _ = _build(root, capsys)
    # a fresh process: the record, not the pipeline; the Docker SDK and the pipeline are never imported
    code = ("import sys; from builder.cli import main; rc = main(['build', sys.argv[1]]); "
            "print('imported:', sorted(m for m in ('docker', 'builder.pipeline', 'builder.engine.client') "
            "if m in sys.modules)); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code, str(root / IMAGE)], capture_output=True, text=True, cwd=root,
                       env={**os.environ, "PYTHONPATH": str(root)})
    assert p.returncode == 0, p.stderr
    assert NOOP in p.stderr
    assert p.stdout == first + "imported: []\n"  # the same summary the build printed


def test_a_moved_tag_is_a_miss_and_the_build_puts_it_back(root: Path, capsys: pytest.CaptureFixture[str],
                                                          docker_client: docker.DockerClient) -> None:
    _build(root, capsys)
    right = docker_client.images.get(TAG).id
    other = next(i for i in docker_client.images.list() if i.id != right and i.tags)
    repo, tag = TAG.split(":")
    docker_client.api.tag(other.id, repo, tag)
    try:
        _, err = _build(root, capsys)
        assert NOOP not in err
    finally:
        if docker_client.images.get(TAG).id != right:
            docker_client.api.tag(right, repo, tag)
    assert docker_client.images.get(TAG).id == right
    assert NOOP in _build(root, capsys)[1]  # and the next one is a no-op again


def test_a_touched_output_is_a_miss(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _build(root, capsys)
    manifest = root / "build" / "images" / "container-base" / "manifest.json"
    os.utime(manifest, ns=(manifest.stat().st_atime_ns, manifest.stat().st_mtime_ns + 1_000_000_000))
    assert NOOP not in _build(root, capsys)[1]
    assert NOOP in _build(root, capsys)[1]


def test_what_the_record_cannot_see_through_always_runs_the_pipeline(root: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _build(root, capsys)
    assert NOOP not in _build(root, capsys, "--locked")[1]  # --locked resolves again, by definition
    assert NOOP in _build(root, capsys)[1]  # and what it left is the plain build's
    # other inputs, another record: the --set build runs; it builds under the plain tags, so the plain
    # build's record sees its tag moved and the pipeline puts it back
    assert NOOP not in _build(root, capsys, "--set", "base.tools=[procps, kmod]")[1]
    assert NOOP not in _build(root, capsys)[1]
    assert NOOP in _build(root, capsys)[1]


def test_a_build_whose_lock_pins_too_little_answers_from_its_record_with_the_kept_resolution(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The lock file does not pin a --set build's packages: the build resolves into build/resolved/;
    the same build again composes with that resolution, as the pipeline would, and is a no-op (as
    gpu-node is, built with the offline-source --set values)."""
    changed = ("--set", "base.tools=[procps, kmod, iproute2]")
    _build(root, capsys, *changed)
    assert NOOP in _build(root, capsys, *changed)[1]
    assert NOOP not in _build(root, capsys)[1]  # the plain tags back
