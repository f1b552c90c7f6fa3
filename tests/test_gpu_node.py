"""gpu-node as a real GPU node: the nvidia-driver, firmware and nvidia-container-runtime layers.

Fast tests run the layers' scripts against fixtures and compose the definitions: a wrong
parameter of each layer is an error, the fabric manager / driver version mismatch names both
versions, the runtime configuration parses and the host's dockerd and containerd accept it.
The slow tests build gpu-node with configs/dgx-h100.yaml, boot it under emulation and check
the driver's module files, the nouveau blacklist in the initramfs and the GPU services.

NVIDIA's repositories cannot be reached everywhere (not from CI here): the container toolkit and
fabric manager come from an offline source built from the stand-in packages in
tests/fixtures/container-toolkit (see its README), served over HTTP on the engine's bridge
(tests/support/offline.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fake_tools import fake, fake_tools
from support.keys import make_key
from support.metrics import assert_promtool_accepts
from support.offline import build_offline_sources, offline_sets, serve
from support.reports import assert_all_passed, report_of_test

ROOT = Path(__file__).resolve().parent.parent
FIRMWARE_FIXTURES = ROOT / "tests" / "fixtures" / "firmware"
GPU_PRESENT = ROOT / "layers" / "gpu-present" / "files" / "nvidia-gpu-present"
FIRMWARE_FILES = ROOT / "layers" / "firmware" / "files"
DRIVER_VERSION = "535.309.01"  # the dgx-h100 config's: bookworm-security's, the driver layer's default


CLI = [sys.executable, "-m", "builder.cli", "--root", str(ROOT)]


def nodeforge(*args: str, timeout: int = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


# --------------------------------------------------------------------------- definitions

def test_fabricmanager_version_mismatch_is_a_definition_error_naming_both_versions() -> None:
    proc = nodeforge("plan", "images/gpu-node.yaml", "-c", "dgx-h100",
                     "--set", "nvidia-driver.fabricmanager_version=535.247.01")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "fabric manager 535.247.01 does not equal the NVIDIA driver 535.309.01" in proc.stderr
    assert "asserts.fabricmanager-equals-driver" in proc.stderr and "Traceback" not in proc.stderr
    assert "set nvidia-driver.fabricmanager_version to 535.309.01" in proc.stderr
    # the same mismatch with fabric manager off is no error: nothing installs it
    off = nodeforge("plan", "images/gpu-node.yaml", "-c", "default",
                    "--set", "nvidia-driver.fabricmanager_version=535.247.01")
    assert off.returncode == 0, off.stderr


def _plan(config: str) -> dict[str, Any]:
    proc = nodeforge("plan", "images/gpu-node.yaml", "-c", config, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_dgx_h100_config_composes_fabric_manager_at_the_driver_version() -> None:
    plan = _plan("dgx-h100")
    assert plan["params"]["nvidia-driver.fabricmanager"]["value"] is True
    assert plan["params"]["nvidia-driver.fabricmanager"]["source"].startswith("config dgx-h100")
    (driver,) = [s for s in plan["steps"] if s["layer"] == "nvidia-driver"]
    assert f"nvidia-fabricmanager-535={DRIVER_VERSION}-1" in driver["apply"]
    assert "apt-mark hold nvidia-fabricmanager-535" in driver["apply"]
    assert "intel_iommu=on" not in [a["value"] for a in plan["kernel_args"]]  # A2: VT-d off on a bare-metal DGX
    (default,) = [s for s in _plan("default")["steps"] if s["layer"] == "nvidia-driver"]
    assert "nvidia-fabricmanager-535=" not in default["apply"]
    assert driver["key"] != default["key"]


@pytest.mark.parametrize("setting, expected", [
    ("nvidia-driver.flavour=tesla-550", "nvidia-driver.flavour"),
    ("nvidia-container-runtime.default_runtime=crun", "nvidia-container-runtime.default_runtime"),
    ("firmware.bundle=[\"https://fw.example/fw-ConnectX7-28.39.1002.bin 12ab\"]", "bundle-entries-are-url-and-sha256"),
    ("firmware.tool=/usr/bin/mstflint", "first-boot-update-is-complete"),
])
def test_a_wrong_parameter_of_each_layer_is_a_definition_error(setting: str, expected: str) -> None:
    proc = nodeforge("plan", "images/gpu-node.yaml", "-c", "default", "--set", setting)
    assert proc.returncode == 2, proc.stdout
    assert expected in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpu-node rendered with the dgx-h100 config: the files each layer writes, unbuilt."""
    out = tmp_path_factory.mktemp("render") / "ctx"
    proc = nodeforge("render", "images/gpu-node.yaml", str(out), "-c", "dgx-h100")
    if proc.returncode != 0 and "unrecognized arguments" in proc.stderr:
        proc = nodeforge("render", "images/gpu-node.yaml", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def _layer_file(ctx: Path, layer: str, path: str) -> Path:
    (hit,) = [p for p in ctx.glob(f"*-{layer}/root{path}")]
    return hit


def test_runtime_configuration_files_parse_and_say_what_gpu_facts_say(rendered: Path) -> None:
    daemon = json.loads(_layer_file(rendered, "nvidia-container-runtime", "/etc/docker/daemon.json").read_text())
    assert daemon["runtimes"] == {"nvidia": {"path": "nvidia-container-runtime", "args": []}}
    assert daemon["default-runtime"] == "nvidia"
    dropin = tomllib.loads(_layer_file(rendered, "nvidia-container-runtime",
                                       "/etc/containerd/conf.d/99-nvidia.toml").read_text())
    cri = dropin["plugins"]["io.containerd.grpc.v1.cri"]
    nvidia = cri["containerd"]["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert cri["containerd"]["default_runtime_name"] == "nvidia"
    assert cri["cni"]["bin_dir"] == "/usr/lib/cni", "the import replaces the CRI table: Debian's CNI path must stay"
    main = tomllib.loads(_layer_file(rendered, "nvidia-container-runtime", "/etc/containerd/config.toml").read_text())
    assert main["version"] == 2 and main["imports"] == ["/etc/containerd/conf.d/*.toml"]
    toolkit = tomllib.loads(_layer_file(rendered, "nvidia-container-runtime",
                                        "/etc/nvidia-container-runtime/config.toml").read_text())
    assert toolkit["nvidia-container-cli"]["ldconfig"] == "@/sbin/ldconfig"
    assert toolkit["nvidia-container-runtime"]["mode"] == "auto"
    options = _layer_file(rendered, "nvidia-driver", "/etc/modprobe.d/nodeforge-nvidia-driver.conf").read_text()
    assert re.search(r"^options nvidia-current NVreg_RestrictProfilingToAdminUsers=1$", options, re.M), options


def test_runc_as_default_runtime_leaves_no_default_behind(tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    proc = nodeforge("render", "images/gpu-node.yaml", str(out), "--set",
                     "nvidia-container-runtime.default_runtime=runc")
    assert proc.returncode == 0, proc.stderr
    daemon = json.loads(_layer_file(out, "nvidia-container-runtime", "/etc/docker/daemon.json").read_text())
    assert "default-runtime" not in daemon and "nvidia" in daemon["runtimes"]
    dropin = tomllib.loads(_layer_file(out, "nvidia-container-runtime",
                                       "/etc/containerd/conf.d/99-nvidia.toml").read_text())
    assert "default_runtime_name" not in dropin["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]


def _dockerd_accepts(config: Path, tmp: Path) -> tuple[bool, str]:
    """dockerd 20.10 has no --validate: it loads and checks the file first, then stops at a pid
    file that cannot be created, before it touches networks or the engine's state (it only
    bind-mounts its own data root, here in a private mount namespace)."""
    if shutil.which("dockerd") is None:
        pytest.fail("dockerd is not installed: run `make setup`")
    helptext = subprocess.run(["dockerd", "--help"], capture_output=True, text=True).stdout
    if "--validate" in helptext:
        p = subprocess.run(["dockerd", "--validate", "--config-file", str(config)], capture_output=True, text=True)
        return p.returncode == 0, p.stdout + p.stderr
    # in a mount namespace of its own: dockerd bind-mounts its data root, which must not outlive it
    p = subprocess.run(["unshare", "--mount", "--propagation", "private",
                        "dockerd", "--config-file", str(config), "--data-root", str(tmp / "root"),
                        "--exec-root", str(tmp / "exec"), "--pidfile", "/dev/null/dockerd.pid",
                        "-H", f"unix://{tmp}/docker.sock"], capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    return "unable to configure the Docker daemon" not in out and "mkdir /dev/null" in out, out


def test_host_dockerd_accepts_the_daemon_json_and_rejects_a_broken_one(rendered: Path, tmp_path: Path) -> None:
    ok, out = _dockerd_accepts(_layer_file(rendered, "nvidia-container-runtime", "/etc/docker/daemon.json"), tmp_path)
    assert ok, out
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"default-runtime": "nvidia"}))   # a default runtime nobody defined
    ok, out = _dockerd_accepts(broken, tmp_path)
    assert not ok and "default runtime" in out, out


def test_host_containerd_merges_the_drop_in(rendered: Path, tmp_path: Path) -> None:
    if shutil.which("containerd") is None:
        pytest.fail("containerd is not installed: run `make setup`")
    main = _layer_file(rendered, "nvidia-container-runtime", "/etc/containerd/config.toml").read_text()
    (tmp_path / "conf.d").mkdir()
    shutil.copy(_layer_file(rendered, "nvidia-container-runtime", "/etc/containerd/conf.d/99-nvidia.toml"),
                tmp_path / "conf.d" / "99-nvidia.toml")
    (tmp_path / "config.toml").write_text(main.replace("/etc/containerd/conf.d", str(tmp_path / "conf.d")))
    dump = subprocess.run(["containerd", "--config", str(tmp_path / "config.toml"), "config", "dump"],
                          capture_output=True, text=True, timeout=60)
    assert dump.returncode == 0, dump.stderr
    merged = tomllib.loads(dump.stdout)
    cri = merged["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert cri["containerd"]["default_runtime_name"] == "nvidia"
    assert cri["cni"]["bin_dir"] == "/usr/lib/cni"
    assert str(tmp_path / "conf.d" / "99-nvidia.toml") in merged["imports"]


# --------------------------------------------------------------------------- driver scripts

def _pci(root: Path, bdf: str, vendor: str, cls: str) -> None:
    d = root / bdf
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(cls + "\n")


@pytest.mark.parametrize("devices, gpu, nvswitch", [
    ([("0000:00:02.0", "0x8086", "0x030000")], 1, 1),                                    # Intel VGA only
    ([("0000:1b:00.0", "0x10de", "0x030200")], 0, 1),                                    # H100 (3D controller)
    ([("0000:1b:00.0", "0x10de", "0x030200"), ("0000:05:00.0", "0x10de", "0x068000")], 0, 0),  # HGX: GPU + NVSwitch
    ([("0000:3b:00.0", "0x15b3", "0x020700")], 1, 1),                                    # ConnectX only
    ([], 1, 1),
])
def test_gpu_units_condition_finds_gpus_and_nvswitches_on_the_pci_bus(
        tmp_path: Path, devices: list[tuple[str, str, str]], gpu: int, nvswitch: int) -> None:
    for bdf, vendor, cls in devices:
        _pci(tmp_path, bdf, vendor, cls)
    script = str(GPU_PRESENT)
    g = subprocess.run([script, "--sysfs", str(tmp_path)], capture_output=True, text=True)
    s = subprocess.run([script, "--nvswitch", "--sysfs", str(tmp_path)], capture_output=True, text=True)
    assert (g.returncode, s.returncode) == (gpu, nvswitch), g.stdout + s.stdout


# --------------------------------------------------------------------------- firmware scripts

def test_firmware_stage_checks_every_sha256(tmp_path: Path) -> None:
    blob = tmp_path / "src" / "fw-ConnectX7-28.39.1002.bin"
    blob.parent.mkdir()
    blob.write_bytes(b"\x7fFW" * 1000)
    good = hashlib.sha256(blob.read_bytes()).hexdigest()
    stage = str(FIRMWARE_FILES / "firmware-stage")
    ok = subprocess.run([stage, str(tmp_path / "ok"), f"file:{blob}", good], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "ok" / blob.name).read_bytes() == blob.read_bytes()
    assert (tmp_path / "ok" / "SHA256SUMS").read_text() == f"{good}  {blob.name}\n"
    wrong = ("0" if good[0] != "0" else "1") + good[1:]
    bad = subprocess.run([stage, str(tmp_path / "bad"), f"file:{blob}", wrong], capture_output=True, text=True)
    assert bad.returncode == 1
    assert f"firmware {blob.name}: expected sha256 {wrong}, got {good}" in bad.stderr
    assert not (tmp_path / "bad" / blob.name).exists() and not (tmp_path / "bad" / "SHA256SUMS").exists()


WANTED = "28.39.1002"
IMAGE = "fw-ConnectX7-28.39.1002.bin"


def _firmware_run(tmp: Path, scenario: str, **conf: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """One boot's run of the first-boot update against the fake mstflint replaying `scenario`."""
    fw = tmp / "firmware"
    if not fw.exists():
        fw.mkdir()
        (fw / IMAGE).write_bytes(b"image 28.39.1002")
        sha = hashlib.sha256((fw / IMAGE).read_bytes()).hexdigest()
        (fw / "SHA256SUMS").write_text(f"{sha}  {IMAGE}\n")
        (tmp / "textfile").mkdir()
    settings = {
        "COMPONENT": "nic", "TOOL": fake("mstflint"), "QUERY_ARGS": "-d 0000:3b:00.0 query",
        "VERSION_LABEL": "FW Version:", "RUNNING_LABEL": "FW Version(Running):",
        "FLASH_ARGS": "-d 0000:3b:00.0 -i {image} -y burn", "IMAGE": IMAGE,
        "WANTED": WANTED, "POWER_CYCLE_REGEX": "power cycle|cold reboot", "DRY_RUN": "false",
        "RESET_REGEX": "mlxfwreset|reboot machine|reboot the machine",
        "FIRMWARE_DIR": str(fw), "STATE_DIR": str(tmp / "state"), "TEXTFILE_DIR": str(tmp / "textfile"),
    }
    settings.update(conf)
    (tmp / "firmware-update.conf").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    env, calls = fake_tools(FIRMWARE_FIXTURES / scenario, tmp,
                            NODEFORGE_FIRMWARE_CONF=str(tmp / "firmware-update.conf"))
    before = len(calls)
    proc = subprocess.run([str(FIRMWARE_FILES / "firmware-update")], capture_output=True, text=True, env=env)
    return proc, calls.argv()[before:]


def _state(tmp: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (tmp / "state" / "nic.state").read_text().splitlines())


def _burns(calls: list[list[str]]) -> list[list[str]]:
    return [c for c in calls if "burn" in c]


def test_firmware_update_flashes_an_outdated_nic_once_and_records_needs_reset(tmp_path: Path) -> None:
    proc, calls = _firmware_run(tmp_path, "connectx7-outdated")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _burns(calls) == [["-d", "0000:3b:00.0", "-i", str(tmp_path / "firmware" / IMAGE), "-y", "burn"]]
    state = _state(tmp_path)
    # F1: after the burn the NIC still runs 28.38.1002 (FW Version(Running)): not "updated"
    assert (state["outcome"], state["before"], state["after"], state["wanted"]) == \
        ("needs-reset", "28.38.1002", "28.38.1002", WANTED)
    assert "installed 28.38.1002, wanted 28.39.1002" in proc.stdout
    metric = (tmp_path / "textfile" / "nodeforge_firmware_nic.prom").read_text()
    assert 'nodeforge_firmware_update_outcome{component="nic",outcome="needs-reset"} 1' in metric
    assert 'nodeforge_firmware_update_outcome{component="nic",outcome="updated"} 0' in metric
    assert 'nodeforge_firmware_update_outcome{component="nic",outcome="failed"} 0' in metric
    assert_promtool_accepts(metric)


def test_firmware_update_leaves_a_current_nic_alone(tmp_path: Path) -> None:
    proc, calls = _firmware_run(tmp_path, "connectx7-current")
    assert proc.returncode == 0, proc.stderr
    assert _burns(calls) == [] and calls == [["-d", "0000:3b:00.0", "query"]]
    assert _state(tmp_path)["outcome"] == "current"


def test_firmware_update_never_retries_a_failed_flash(tmp_path: Path) -> None:
    proc, calls = _firmware_run(tmp_path, "connectx7-burn-fails")
    assert proc.returncode == 1
    assert len(_burns(calls)) == 1 and "MFE_FLASH_WRITE_ERROR" in proc.stdout
    assert _state(tmp_path)["outcome"] == "failed"
    again, calls = _firmware_run(tmp_path, "connectx7-burn-fails")       # the next boot
    assert again.returncode == 0 and calls == [], "a failed flash must not be tried again"
    assert "not retrying" in again.stdout
    metric = (tmp_path / "textfile" / "nodeforge_firmware_nic.prom").read_text()
    assert 'outcome="failed"} 1' in metric


def test_firmware_update_that_needs_a_power_cycle_is_not_repeated(tmp_path: Path) -> None:
    proc, calls = _firmware_run(tmp_path, "connectx7-outdated", POWER_CYCLE_REGEX="mlxfwreset or reboot")
    assert proc.returncode == 0, proc.stderr
    assert len(_burns(calls)) == 1 and _state(tmp_path)["outcome"] == "needs-power-cycle"
    # next boot, still before the power cycle: the running firmware is the old one, no re-flash
    again, calls = _firmware_run(tmp_path, "connectx7-burn-fails", POWER_CYCLE_REGEX="mlxfwreset or reboot")
    assert _burns(calls) == [] and "waits for a power cycle" in again.stdout
    # after the power cycle the wanted version runs: current
    done, calls = _firmware_run(tmp_path, "connectx7-current", POWER_CYCLE_REGEX="mlxfwreset or reboot")
    assert _burns(calls) == [] and _state(tmp_path)["outcome"] == "current"
    assert "the power cycle brought up 28.39.1002" in done.stdout


def test_firmware_update_dry_run_flashes_nothing(tmp_path: Path) -> None:
    proc, calls = _firmware_run(tmp_path, "connectx7-outdated", DRY_RUN="true")
    assert proc.returncode == 0, proc.stderr
    assert _burns(calls) == [] and "dry run: would run" in proc.stdout and "28.38.1002 -> 28.39.1002" in proc.stdout
    assert not (tmp_path / "state" / "nic.state").exists()
    assert 'outcome="dry-run"} 1' in (tmp_path / "textfile" / "nodeforge_firmware_nic.prom").read_text()


def test_firmware_update_refuses_a_staged_image_that_changed(tmp_path: Path) -> None:
    _firmware_run(tmp_path, "connectx7-current")                          # stages the files
    (tmp_path / "firmware" / IMAGE).write_bytes(b"tampered")
    (tmp_path / "state" / "nic.state").unlink()
    proc, calls = _firmware_run(tmp_path, "connectx7-burn-fails")
    assert proc.returncode == 1 and _burns(calls) == []
    assert "does not match its sha256" in proc.stdout and _state(tmp_path)["outcome"] == "failed"


def test_firmware_update_records_a_device_it_cannot_query(tmp_path: Path) -> None:
    proc, calls = _firmware_run(tmp_path, "connectx7-no-device")
    assert proc.returncode == 1 and _burns(calls) == []
    assert "MFE_CR_ERROR" in proc.stderr and _state(tmp_path)["outcome"] == "failed"


# --------------------------------------------------------------------------- builds and boots

@pytest.fixture(scope="session")
def offline_source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of the stand-in offline sources, served where build containers reach them."""
    d = tmp_path_factory.mktemp("offline")
    build_offline_sources(d)
    with serve(d) as base:
        yield base


@pytest.fixture(scope="session")
def dgx_node(offline_source: str) -> str:
    """gpu-node built with configs/dgx-h100.yaml (layers cached by key across runs)."""
    proc = nodeforge("build", "images/gpu-node.yaml", "-c", "dgx-h100", *offline_sets(offline_source))
    assert proc.returncode == 0, proc.stderr[-6000:]
    return offline_source


@pytest.fixture(scope="session")
def dgx_report(dgx_node: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return report_of_test(CLI, "images/gpu-node.yaml", tmp_path_factory.mktemp("dgx-report"), "-c", "dgx-h100",
                       *offline_sets(dgx_node), "--boot-modes", "direct")


def _results(data: dict[str, Any], layer: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in data["results"] if r.get("layer") == layer}


@pytest.mark.slow
@pytest.mark.docker
def test_dgx_h100_node_builds_boots_and_passes_every_layer_test(dgx_report: dict[str, Any]) -> None:
    assert_all_passed(dgx_report)
    verdicts = [r for r in dgx_report["results"] if r["kind"] == "verdict"]
    assert verdicts and all(r["status"] == "passed" for r in verdicts), verdicts


@pytest.mark.slow
@pytest.mark.docker
def test_dgx_h100_node_has_the_driver_for_its_kernel_and_skips_gpu_services(dgx_report: dict[str, Any]) -> None:
    driver = _results(dgx_report, "nvidia-driver")
    must_pass = [
        f"module files exist for every image kernel (modinfo -k), version {DRIVER_VERSION}",
        "dkms shows the module installed for the image kernel",
        "nouveau blacklisted in the root file system through Debian's alternatives",
        "no private key of any kind in the image (no dkms MOK key, no PEM private key)",
        "the driver and its libraries are held",
        "unattended-upgrades is told to leave the driver alone",
        f"fabric manager {DRIVER_VERSION} installed, held and enabled",
    ]
    for name in must_pass:
        assert driver[name]["status"] == "passed", (name, driver[name])
    boot = {n.rsplit(" [", 1)[0]: r for n, r in driver.items() if r["scope"] == "boot"}
    assert boot["nvidia-persistenced is skipped for lack of a GPU, not failed"]["status"] == "passed"
    assert boot["fabric manager is skipped on a node without NVSwitches, not failed"]["status"] == "passed"
    gpu_only = [r for n, r in boot.items() if n.startswith(("the NVIDIA driver loads", "the nvidia module is loaded"))]
    assert gpu_only and all(r["status"] == "skipped" for r in gpu_only), gpu_only
    runtime = {n.rsplit(" [", 1)[0]: r for n, r in _results(dgx_report, "nvidia-container-runtime").items()}
    for name in ("no ordering cycle and no failed unit in the booted node",
                 "nvidia-cdi-refresh is skipped for lack of a GPU, not failed",
                 "dockerd accepts daemon.json", "no CDI specification baked into the image"):
        assert runtime[name]["status"] == "passed", (name, runtime[name])


@pytest.mark.slow
@pytest.mark.docker
def test_dgx_h100_initramfs_blacklists_nouveau(dgx_node: str) -> None:
    initrd = ROOT / "build" / "images" / "gpu-node@dgx-h100" / "initrd.img"
    assert initrd.is_file(), "gpu-node was not assembled"
    listing = subprocess.run(
        ["docker", "run", "--rm", "-v", f"{initrd}:/initrd.img:ro", "nodeforge/gpu-node:0.1.0-dgx-h100",
         "sh", "-c", "lsinitramfs /initrd.img | grep -E 'modprobe.d/.*nouveau'; "
                     "d=$(mktemp -d); cd $d && unmkinitramfs /initrd.img x >/dev/null && "
                     "cat $(find x -path '*modprobe.d/nvidia-blacklists-nouveau.conf')"],
        capture_output=True, text=True, timeout=300)
    assert listing.returncode == 0, listing.stderr
    assert "etc/modprobe.d/nvidia-blacklists-nouveau.conf" in listing.stdout
    assert "blacklist nouveau" in listing.stdout


@pytest.mark.slow
@pytest.mark.docker
def test_toolkit_build_fails_clearly_without_repository_or_offline_source(dgx_node: str) -> None:
    """NVIDIA's repository is unreachable here: with no offline source the layer must say so."""
    proc = nodeforge("build", "images/gpu-node.yaml", "-c", "dgx-h100",
                     *offline_sets(dgx_node)[4:],  # the fabric manager's source only
                     "--set", "nvidia-container-runtime.repository=http://nvidia-repo.invalid/stable/deb/$(ARCH)")
    assert proc.returncode == 1, proc.stderr[-3000:]
    log = proc.stderr + "".join(p.read_text(errors="replace")
                                for p in (ROOT / "build" / "logs" / "gpu-node").glob("*nvidia-container-runtime*"))
    assert "the repository http://nvidia-repo.invalid/stable/deb/$(ARCH) cannot be reached from this build" in log
    assert "offline source" in log


@pytest.mark.slow
@pytest.mark.docker
def test_toolkit_version_other_than_the_source_carries_fails_the_build(dgx_node: str) -> None:
    proc = nodeforge("build", "images/gpu-node.yaml", "-c", "dgx-h100", *offline_sets(dgx_node),
                     "--set", "nvidia-container-runtime.toolkit_version=1.17.8-1")
    assert proc.returncode == 1
    log = proc.stderr + "".join(p.read_text(errors="replace")
                                for p in (ROOT / "build" / "logs" / "gpu-node").glob("*nvidia-container-runtime*"))
    assert "installed at '1.18.0-1', the image wants 1.17.8-1" in log


@pytest.mark.slow
@pytest.mark.docker
def test_dgx_h100_disk_carries_the_driver_signed_with_the_key_given_at_build_time(dgx_node: str,
                                                                                  tmp_path: Path) -> None:
    """--secret module-signing=PEM: DKMS's nvidia modules signed on the exported tree (the engine's
    layers keep them unsigned), the certificate beside them for mokutil, the key nowhere."""
    import tarfile

    _, _, pem = make_key(tmp_path / "mok", cn="nodeforge test MOK")
    env = {**os.environ, "NODEFORGE_BUILD_DIR": str(tmp_path / "build")}
    proc = subprocess.run([sys.executable, "-m", "builder.cli", "build", "images/gpu-node.yaml", "-c", "dgx-h100",
                           *offline_sets(dgx_node), "--secret", f"module-signing={pem}", "--format", "netboot"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    signed = re.search(r"signed (\d+) modules with .*nodeforge test MOK", proc.stderr)
    assert signed and int(signed.group(1)) >= 1, proc.stderr[-3000:]
    archive = tmp_path / "build" / "images" / "gpu-node@dgx-h100" / "rootfs.tar.gz"
    out = tmp_path / "x"
    with tarfile.open(archive) as tar:
        wanted = [m for m in tar.getmembers() if re.search(r"/updates/dkms/nvidia-current(-open)?\.ko$", m.name)
                  or m.name.endswith("var/lib/nodeforge/module-signing.der")]
        tar.extractall(out, members=wanted, filter="data")
    module = next(out.rglob("nvidia-current*.ko"))  # dgx-h100 runs the proprietary modules: nvidia-current.ko
    signer = subprocess.run(["modinfo", "-F", "signer", str(module)], capture_output=True, text=True)
    assert signer.stdout.strip() == "nodeforge test MOK", signer
    assert next(out.rglob("module-signing.der")).stat().st_size > 0
    key_line = pem.read_text().splitlines()[1]
    assert key_line not in proc.stderr and not any(
        key_line in p.read_text(errors="replace") for p in (tmp_path / "build").rglob("*.log"))
