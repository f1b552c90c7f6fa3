"""Security updates tracked: the images' bases carry Debian's security archive, the golden node's
driver is the security archive's, and `lock --check` names what a pin holds below a security update.

The resolution is real (Debian's archive, the image's own base): where the archive cannot be
reached the engine test skips, saying so."""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from builder import debian
from builder.debversion import compare

ROOT = Path(__file__).resolve().parent.parent
SECURITY_RELEASE = "http://deb.debian.org/debian-security/dists/bookworm-security/InRelease"


def _locked(lock: Path, package: str) -> str:
    data = yaml.safe_load(lock.read_text())
    return str(data["archives"][package]["version"])


def test_bases_carry_the_security_archive_beside_the_mirror() -> None:
    spec = {"suite": "bookworm", "mirror": "http://deb.debian.org/debian", "components": ["main", "non-free"],
            "variant": "minbase", "include": [], "security": "http://deb.debian.org/debian-security"}
    cmd = debian.mmdebstrap_command(spec, "OUT")
    assert cmd[-3:] == ["OUT", "http://deb.debian.org/debian",
                        "deb http://deb.debian.org/debian-security bookworm-security main non-free"]
    assert debian.mmdebstrap_command({**spec, "security": ""}, "OUT")[-1] == "http://deb.debian.org/debian"


def test_every_driver_lock_is_at_or_above_the_security_version() -> None:
    """Every GPU node (gpu-node, dgx-h100, v100-slurm) runs bookworm-security's 535.309.01 or later,
    and no lock holds the open modules (Debian 12's only build of them, 535.261.03, is below it)."""
    for name in ("gpu-node", "gpu-node@dgx-h100", "gpu-node@v100-slurm"):
        lock = ROOT / "images" / f"{name}.lock"
        version = _locked(lock, "nvidia-kernel-dkms")
        assert compare(version, "535.309.01-0+deb12u1") >= 0, (name, version)
        assert "nvidia-open-kernel-dkms" not in lock.read_text(), name


def _archive_reachable() -> bool:
    try:
        with urllib.request.urlopen(SECURITY_RELEASE, timeout=10):
            return True
    except OSError:
        return False


@pytest.mark.docker
def test_lock_check_flags_a_planted_older_driver_pin_as_security(tmp_path: Path) -> None:
    if not _archive_reachable():
        pytest.skip(f"Debian's security archive cannot be reached ({SECURITY_RELEASE}): the check resolves there")
    tree = tmp_path / "tree"
    for folder in ("layers", "images", "configs"):
        shutil.copytree(ROOT / folder, tree / folder)
    lock = tree / "images" / "gpu-node.lock"
    current = _locked(lock, "nvidia-smi")
    lock.write_text(lock.read_text().replace(current, "535.261.03-1"))  # the copied lock, planted older

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "builder", "--root", str(tree), "lock", "images/gpu-node.yaml",
                               "--check", *args], capture_output=True, text=True, cwd=ROOT, timeout=900)

    # the layer asks for the security version: the fresh resolution moves the planted pin, from security
    moved = check()
    assert moved.returncode == 1, moved.stdout + moved.stderr
    assert f"~ nvidia-driver: nvidia-smi 535.261.03-1 -> {current} [security: " in moved.stdout, moved.stdout
    # a config that pins the older driver holds it there: still named, as held below the security update
    held = check("--set", "nvidia-driver.version=535.261.03", "--set", "nvidia-driver.fabricmanager_version=535.261.03")
    assert held.returncode == 1, held.stdout + held.stderr
    assert (f"! nvidia-driver: nvidia-smi 535.261.03-1 is held below the security archive's {current} [security]"
            in held.stdout), held.stdout
    assert (ROOT / "images" / "gpu-node.lock").read_text().count(current) > 0  # the repository's lock untouched


# --- which CUDA images run on the config's nodes -------------------------------------------------

def _plan_stderr(image: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "builder", "plan", f"images/{image}.yaml", *args],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_plan_warns_when_a_cuda_13_image_meets_a_535_node() -> None:
    warned = _plan_stderr("cuda-13.0-runtime", "-c", "dgx-h100")
    assert "needs driver >= 580 (NVIDIA_REQUIRE_CUDA)" in warned
    assert "run 535.309.01 (the nvidia-driver layer's default)" in warned
    assert "cuda-compat" in warned
    assert "needs driver" in _plan_stderr("cuda-13.0-base")  # the layer's default driver: 535 too
    for image in ("cuda-12.9-runtime", "cuda-11.8-runtime", "node-minimal", "gpu-node"):
        assert "needs driver" not in _plan_stderr(image), image  # 12.x needs 525, 11.x 450; no CUDA env
