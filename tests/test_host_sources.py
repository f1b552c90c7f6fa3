"""A source the build host holds: `--set L.P=file:DIR` names a directory on the build host (where a
vendor's repository cannot be reached). The step sees it read-only at /media, a bind mount: nothing
of it enters a layer, the rendered script is the same on every host, and the step key takes the
sha256 of the directory's SHA256SUMS, not its path. Only the command line can name one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from support.offline import build_offline_sources

from builder.debian import parse_dpkg_status

ROOT = Path(__file__).resolve().parent.parent
TOOLKIT = "nvidia-container-runtime.offline_source"
FABRIC_MANAGER = "nvidia-driver.fabricmanager_source"


def nodeforge(*args: str, root: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", "--root", str(root), *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=3600)


def plan(*sets: str, root: Path = ROOT) -> dict[str, Any]:
    proc = nodeforge("plan", "images/gpu-node.yaml", "--json", *[a for s in sets for a in ("--set", s)], root=root)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def toolkit_step(doc: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in doc["steps"] if s["layer"] == "nvidia-container-runtime")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_offline_sources(tmp_path_factory.mktemp("host-sources"))


def test_the_step_sees_the_mount_and_its_key_takes_the_list_not_the_path(sources: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    one = toolkit_step(plan(f"{TOOLKIT}=file:{sources['toolkit']}"))
    assert "file:/media/" in one["apply"] and str(sources["toolkit"]) not in one["apply"]
    (source,) = one["host_sources"]
    assert source["mount"] == "/media" and source["path"] == str(sources["toolkit"])
    # the same files elsewhere: the same key; one file changed (its list with it): another key
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(sources["toolkit"], elsewhere)
    assert toolkit_step(plan(f"{TOOLKIT}=file:{elsewhere}"))["key"] == one["key"]
    sums = elsewhere / "SHA256SUMS"
    sums.write_text(sums.read_text() + "0" * 64 + "  extra_1.0_all.deb\n")
    assert toolkit_step(plan(f"{TOOLKIT}=file:{elsewhere}"))["key"] != one["key"]
    shown = nodeforge("plan", "images/gpu-node.yaml", "--set", f"{TOOLKIT}=file:{elsewhere}")
    assert f"reads {elsewhere} (build host, read-only at /media; SHA256SUMS" in shown.stdout, shown.stdout


@pytest.mark.parametrize("make, expected", [
    (lambda d: d / "missing", "is not a directory"),
    (lambda d: d, "has no SHA256SUMS file"),
    (lambda d: d / "a:b", "has a ':' or ','"),
])
def test_a_host_directory_that_is_no_source_is_a_definition_error(tmp_path: Path, make: Any,
                                                                  expected: str) -> None:
    proc = nodeforge("plan", "images/gpu-node.yaml", "--set", f"{TOOLKIT}=file:{make(tmp_path)}")
    assert proc.returncode == 2 and expected in proc.stderr and TOOLKIT in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_definition_cannot_name_a_build_host_directory(sources: dict[str, Path], tmp_path: Path) -> None:
    """A config (from another team, a pull request) naming file:/... is refused: only the person
    running the build shows the build host's files to a step."""
    tree = tmp_path / "tree"
    for folder in ("layers", "images", "configs"):
        shutil.copytree(ROOT / folder, tree / folder)
    (tree / "configs" / "sneaky.yaml").write_text(
        f"name: sneaky\nsummary: names a host directory\nparams:\n  nvidia-container-runtime:\n"
        f"    offline_source: file:{sources['toolkit']}\n")
    proc = nodeforge("plan", "images/gpu-node.yaml", "-c", "sneaky", root=tree)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "a file: source is a directory on the build host, and config sneaky" in proc.stderr
    assert f"--set {TOOLKIT}=file:" in proc.stderr


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(member)
    return f.read() if f is not None else b""


@pytest.mark.slow
@pytest.mark.docker
def test_the_readmes_host_directory_form_builds_the_dgx_node(sources: dict[str, Path], tmp_path: Path) -> None:
    """`make build SET="--set ...offline_source=file:DIR"` as the README writes it: gpu-node with the
    dgx-h100 config, the toolkit and fabric manager from two build-host directories; nothing of them
    in the image."""
    sets = f"--set {TOOLKIT}=file:{sources['toolkit']} --set {FABRIC_MANAGER}=file:{sources['fabricmanager']} " \
           "--format netboot"
    env = {**os.environ, "NODEFORGE_BUILD_DIR": str(tmp_path / "build")}
    proc = subprocess.run(["make", "build", "CONFIG=configs/dgx-h100.yaml", f"SET={sets}"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=3600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    archive = tmp_path / "build" / "images" / "gpu-node@dgx-h100" / "rootfs.tar.gz"  # the netboot root
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        status = tar.extractfile(next(m for m in tar.getmembers() if m.name.lstrip("./") == "var/lib/dpkg/status"))
        assert status is not None
        installed = parse_dpkg_status(status.read().decode())
        # nothing of the sources: no .deb, and no copy of their lists (a layer may ship a SHA256SUMS of its
        # own, as the firmware layer does for its bundles: compared by content, not by name)
        lists = {(d / "SHA256SUMS").read_bytes() for d in (sources["toolkit"], sources["fabricmanager"])}
        leaked = [m.name for m in tar.getmembers() if m.name.endswith(".deb")
                  or (m.isfile() and m.name.endswith("SHA256SUMS") and _read(tar, m) in lists)]
    assert [n for n in names if n.lstrip("./").startswith("media/")] == [], "the mount point must stay empty"
    assert not leaked
    assert installed["nvidia-container-toolkit"]["Version"] == "1.18.0-1"
    assert installed["nvidia-fabricmanager-535"]["Version"] == "535.309.01-1"  # the security driver's
