"""nodeforge gc on a real engine: in a cache namespace of the test's own, an entry no output tag
builds on goes, the steps under an output tag stay, an entry tagged within the age stays, --dry-run
removes nothing, and nothing outside nodeforge's repositories is untagged."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from builder.engine import gc
from builder.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
NS = f"gctest{os.getpid()}"
REPO = f"nodeforge-cache-{NS}"
OUTPUT = f"nodeforge-test/gc{os.getpid()}"


def _tar(content: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = content.encode()
        info = tarfile.TarInfo("marker")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def entries(docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[docker.DockerClient]:
    """REPO:base <- REPO:step (a commit on base) tagged OUTPUT:1 too; REPO:lone on its own."""
    c = docker_client
    monkeypatch.setenv("NODEFORGE_CACHE_NAMESPACE", NS)
    c.api.import_image_from_data(_tar(f"base {NS}"), repository=REPO, tag="base")
    c.api.import_image_from_data(_tar(f"lone {NS}"), repository=REPO, tag="lone")
    container = c.containers.create(f"{REPO}:base", ["true"])
    try:
        step = container.commit(REPO, "step")
    finally:
        container.remove()
    step.tag(OUTPUT, "1")
    try:
        yield c
    finally:
        for ref in (f"{OUTPUT}:1", f"{REPO}:step", f"{REPO}:lone", f"{REPO}:base"):
            try:
                c.api.remove_image(ref)
            except docker.errors.ImageNotFound:
                pass


def _tags(c: docker.DockerClient) -> set[str]:
    return {t for i in c.api.images(all=True) for t in (i.get("RepoTags") or []) if NS in t or OUTPUT in t}


def test_an_entry_no_output_builds_on_goes_and_the_chain_under_an_output_stays(entries: docker.DockerClient) -> None:
    p = gc.plan(entries, 0)
    assert [e.tag for e in p.remove] == [f"{REPO}:lone"]
    assert p.in_use == 2 and p.recent == 0
    assert p.remove[0].tagged is not None
    gc.apply(entries, p)
    assert _tags(entries) == {f"{REPO}:base", f"{REPO}:step", f"{OUTPUT}:1"}
    # without its output tag the chain is the cache's alone: it goes too
    entries.api.remove_image(f"{OUTPUT}:1")
    gc.apply(entries, gc.plan(entries, 0))
    assert _tags(entries) == set()


def test_an_entry_tagged_within_the_age_stays(entries: docker.DockerClient) -> None:
    p = gc.plan(entries, gc.parse_age("1h"))
    assert p.remove == () and p.recent == 1 and p.in_use == 2


def test_the_command_lists_with_dry_run_and_removes_without(entries: docker.DockerClient) -> None:
    cli = [sys.executable, "-m", "builder", "gc", "--older-than", "0s"]
    env = {**os.environ, "NODEFORGE_CACHE_NAMESPACE": NS}
    dry = subprocess.run([*cli, "--dry-run"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert dry.returncode == 0, dry.stderr
    assert f"would remove {REPO}:lone" in dry.stdout and "1 cache entries would go; kept 2" in dry.stdout
    assert f"{REPO}:lone" in _tags(entries)
    done = subprocess.run(cli, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "gc: removed 1 cache entries" in done.stdout
    assert _tags(entries) == {f"{REPO}:base", f"{REPO}:step", f"{OUTPUT}:1"}


def test_a_bad_age_is_a_usage_error() -> None:
    assert gc.parse_age("7d") == 7 * 86400 and gc.parse_age("30m") == 1800 and gc.parse_age("0s") == 0
    with pytest.raises(UsageError, match="expected a number and a unit"):
        gc.parse_age("7 days")
    bad = subprocess.run([sys.executable, "-m", "builder", "gc", "--older-than", "week"], capture_output=True,
                         text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--older-than 'week'" in bad.stderr


def test_only_nodeforge_repositories_are_cache() -> None:
    assert gc.is_cache_tag("nodeforge-cache-bench1:k", None) and gc.is_cache_tag("nodeforge-base:k", None)
    assert not gc.is_cache_tag("nodeforge-cachex:k", None) and not gc.is_cache_tag("nodeforge/gpu-node:1", None)
    assert not gc.is_cache_tag("nodeforge-cache-bench1:k", ("nodeforge-cache", "nodeforge-base"))
