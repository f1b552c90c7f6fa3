"""nodeforge-gpu-health's reset path and epilog (gpu-review H1, H2, H5), on recorded nvidia-smi and kernel logs.

H1: a successful reset is recorded (state file, boot id and seconds since boot), and the Xids logged
before it no longer count, so `--reset` clears its own drain; a later Xid, or a reset from another boot,
still counts. H5: nv-hostengine and dcgm-exporter are stopped around the reset and started again even
when the reset fails (a fake systemctl records the calls). H2: the epilog runs the memory test only
after a failed job. H4: the fabric is read with one --query-gpu (drivers 550+), per GPU with -q -i N on
the 535 branch, and a fabric query that hangs is UNKNOWN, not CRITICAL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.fake_tools import FAKES, fake_tools, merge, overlay

ROOT = Path(__file__).resolve().parent.parent
FILES = ROOT / "layers/gpu-health/files"
SCRIPT = FILES / "gpu-health.py"
EPILOG = FILES / "gpu-health-epilog"
POLICY = ROOT / "layers/node-lib/files/xid-policy.tsv"
GPU = ROOT / "tests/fixtures/gpu"
FIXTURES = ROOT / "tests/fixtures"
BOOT = "6f1c1f5e-6b0a-4c43-9d3e-2a1f0c9e7d11\n"
RESET_RULE = [{"args": "-r -i 3", "stdout": "health-reset-gpu3.txt", "exit": 0}]


def systemctl(tmp: Path, active: bool = True) -> Path:
    """A fake systemctl that logs its arguments and says whether a unit is active."""
    fake = tmp / "systemctl"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp / 'systemctl.log'}\n"
                    f"case $1 in is-active) exit {0 if active else 3};; esac\nexit 0\n")
    fake.chmod(0o755)
    return fake


def run(tmp: Path, scenario: Path, *args: str, uptime: float, boot: str = BOOT, slurm: str = "idle",
        active: bool = True, smi: Path = FAKES / "nvidia-smi") -> tuple[dict[str, Any], list[list[str]], list[str]]:
    proc = tmp / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (proc / "uptime").write_text(f"{uptime:.2f} 1000.00\n")
    (proc / "sys/kernel/random/boot_id").write_text(boot)
    fixture = merge(tmp, scenario, FIXTURES / f"health-slurm-{slurm}", name=f"s{len(list(tmp.glob('s*')))}")
    env, calls = fake_tools(fixture, tmp)
    before = len(calls)
    fake_systemctl = systemctl(tmp, active)
    out = subprocess.run([sys.executable, str(SCRIPT), "--config", os.devnull,
                          "--nvidia-smi", str(smi),
                          "--scontrol", str(FAKES / "scontrol"), "--dmesg-command", str(FAKES / "dmesg"),
                          "--xid-policy", str(POLICY), "--proc-root", str(proc), "--node", "gpu01", "--drain", "yes",
                          "--state-dir", str(tmp / "state"), "--systemctl", str(fake_systemctl), "--json", *args],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.stderr == "", out.stderr
    log = tmp / "systemctl.log"
    return json.loads(out.stdout), calls.argv()[before:], log.read_text().splitlines() if log.exists() else []


def updates(argv: list[list[str]]) -> list[list[str]]:
    return [a for a in argv if a[:1] == ["update"]]


def test_h1_a_successful_reset_clears_its_own_drain(tmp_path: Path) -> None:
    # GPU 3 logged Xid 74 at 40211 s; the check drains and resets it at 40300 s
    doc, argv, _ = run(tmp_path, GPU / "health-xid-reset", "--reset", uptime=40300.0)
    assert doc["status"] == "CRITICAL" and doc["resets"][0]["done"] is True
    assert updates(argv)[0][2] == "State=DRAIN"
    assert (tmp_path / "state/last-reset-0000:61:00").read_text() == BOOT.strip() + " 40300.000000\n"
    # the next check reads the same kernel log: those Xids were dealt with by the reset
    doc, argv, _ = run(tmp_path, GPU / "health-xid-reset", "--reset", uptime=40400.0, slurm="drained-by-gpu-health")
    assert doc["status"] == "OK" and "xid" not in doc["failed_rules"], doc
    assert any("before its last reset" in n for n in doc["notes"])
    assert updates(argv) == [["update", "NodeName=gpu01", "State=RESUME"]]
    assert not [a for a in argv if a[:1] == ["-r"]]


def test_h1_an_xid_after_the_reset_and_a_reset_of_another_boot_still_count(tmp_path: Path) -> None:
    run(tmp_path, GPU / "health-xid-reset", "--reset", uptime=40300.0)
    later = (GPU / "health-xid-reset/health-dmesg.txt").read_text() + (
        "[40350.100000] NVRM: Xid (PCI:0000:61:00): 74, pid=61999, name=python3, NVLink: fatal error detected on "
        "link 6(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)\n")
    scenario = overlay(tmp_path / "later", GPU / "health-xid-reset", "dmesg",
                       [{"args": "", "stdout": "later-dmesg.txt"}], {"later-dmesg.txt": later})
    doc, _, _ = run(tmp_path, scenario, uptime=40400.0)
    assert doc["status"] == "CRITICAL" and any("Xid 74 x1" in f["detail"] for f in doc["findings"]), doc
    other_boot, _, _ = run(tmp_path, GPU / "health-xid-reset", uptime=40400.0, boot="another-boot\n")
    assert other_boot["status"] == "CRITICAL" and "xid" in other_boot["failed_rules"]


def test_h1_state_rules_keep_their_persistence_after_a_reset(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "last-reset-0000:d1:00").write_text(BOOT.strip() + " 999999.0\n")  # GPU 6, after every log line
    doc, _, _ = run(tmp_path, GPU / "health-remap-pending", uptime=1000000.0)
    assert "remap-pending" in doc["failed_rules"], doc  # read from the GPU, not from the log


def test_h5_the_reset_stops_the_host_engine_and_exporter_and_starts_them_again(tmp_path: Path) -> None:
    doc, _, units = run(tmp_path, GPU / "health-xid-reset", "--reset", uptime=40300.0)
    assert doc["resets"][0]["done"] is True
    assert units == ["is-active --quiet nvidia-dcgm.service", "is-active --quiet nodeforge-dcgm-exporter.service",
                     "stop nvidia-dcgm.service nodeforge-dcgm-exporter.service",
                     "start nvidia-dcgm.service nodeforge-dcgm-exporter.service"]


def test_h5_units_start_again_when_the_reset_fails_and_inactive_ones_stay_down(tmp_path: Path) -> None:
    failing = overlay(tmp_path / "fail", GPU / "health-xid-reset", "nvidia-smi",
                      [{"args": "-r -i 3", "stdout": "busy.txt", "exit": 255}],
                      {"busy.txt": "Unable to reset GPU 00000000:61:00.0: in use by another process\n"})
    doc, _, units = run(tmp_path, failing, "--reset", uptime=40300.0)
    assert doc["resets"][0]["done"] is False and not (tmp_path / "state").exists()
    assert units[-1] == "start nvidia-dcgm.service nodeforge-dcgm-exporter.service"
    _, _, quiet = run(tmp_path / "b", GPU / "health-xid-reset", "--reset", uptime=40300.0, active=False)
    assert [u for u in quiet if not u.startswith("is-active")] == []


def epilog(tmp: Path, **job_env: str) -> tuple[int, list[str]]:
    fixture = merge(tmp, GPU / "h100-sxm-8gpu", FIXTURES / "health-slurm-idle")
    conf = tmp / "gpu-health.conf"
    conf.write_text(f"[gpu-health]\nnvidia-smi = {FAKES / 'nvidia-smi'}\ndmesg-command = {FAKES / 'dmesg'}\n"
                    f"xid-policy = {POLICY}\nmemtest-command = {FAKES / 'dcgmi'} diag -r memory\n"
                    f"state-dir = {tmp / 'state'}\n")
    env, calls = fake_tools(fixture, tmp, NODEFORGE_GPU_HEALTH=f"{sys.executable} {SCRIPT}",
                            NODEFORGE_GPU_HEALTH_CONFIG=str(conf))
    env.update(job_env)
    for name in ("SLURM_JOB_EXIT_CODE", "SLURM_JOB_EXIT_CODE2", "SLURM_JOB_DERIVED_EC"):
        if name not in job_env:
            env.pop(name, None)
    proc = subprocess.run([str(EPILOG)], capture_output=True, text=True, env=env, timeout=60, check=False)
    return proc.returncode, [c["tool"] for c in calls()]


def test_h2_no_memory_test_after_a_job_that_passed(tmp_path: Path) -> None:
    for n, job in enumerate(({}, {"SLURM_JOB_EXIT_CODE": "0"}, {"SLURM_JOB_EXIT_CODE2": "0:0"})):
        rc, tools = epilog(tmp_path / str(n), **job)
        assert rc == 0 and "nvidia-smi" in tools and "dcgmi" not in tools, (job, tools)


def test_h2_memory_test_after_a_failed_job(tmp_path: Path) -> None:
    for n, job in enumerate(({"SLURM_JOB_EXIT_CODE": "256"}, {"SLURM_JOB_EXIT_CODE2": "0:9"},
                             {"SLURM_JOB_DERIVED_EC": "1"}, {"NODEFORGE_GPU_HEALTH_MEMTEST": "always"})):
        rc, tools = epilog(tmp_path / str(n), **job)
        assert rc == 0 and "dcgmi" in tools, (job, tools)


def test_h4_fabric_from_one_query_and_per_gpu_on_the_535_branch(tmp_path: Path) -> None:
    doc, argv, _ = run(tmp_path / "550", GPU / "health-fabric", "--fabric", "check", uptime=1000.0)
    assert doc["failed_rules"] == ["fabric"] and len([f for f in doc["findings"] if f["rule"] == "fabric"]) == 8
    assert ["-q"] not in argv and not [a for a in argv if a[:2] == ["-q", "-i"]]
    # 535: the driver does not know the fields; each GPU's own -q (never one -q of all eight)
    full = (GPU / "health-fabric/health-nvidia-smi-q.txt").read_text()
    head, *blocks = re.split(r"(?m)^(?=GPU [0-9A-F]{8}:)", full)
    files = {f"q-gpu{i}.txt": head + block for i, block in enumerate(blocks)}
    files["invalid.txt"] = 'Field "fabric.state" is not a valid field to query.\n'
    rules = [{"args": r"--query-gpu=index,pci\.bus_id,fabric\.state,fabric\.status --format=csv",
              "stdout": "invalid.txt", "exit": 2}] + [{"args": f"-q -i {i}", "stdout": f"q-gpu{i}.txt"}
                                                       for i in range(len(blocks))]
    old = overlay(tmp_path / "535", GPU / "health-fabric", "nvidia-smi", rules, files)
    doc, argv, _ = run(tmp_path / "535b", old, "--fabric", "check", uptime=1000.0)
    assert doc["failed_rules"] == ["fabric"], doc
    assert [a for a in argv if a[:1] == ["-q"]] == [["-q", "-i", str(i)] for i in range(8)]


def test_h4_a_fabric_query_that_hangs_is_unknown_not_critical(tmp_path: Path) -> None:
    hang = tmp_path / "nvidia-smi"
    hang.write_text(f'#!/bin/sh\ncase "$*" in *fabric*|-q*) exec sleep 30;; esac\nexec {FAKES / "nvidia-smi"} "$@"\n')
    hang.chmod(0o755)
    doc, argv, _ = run(tmp_path, GPU / "h100-sxm-8gpu", "--fabric", "check", "--command-timeout", "1",
                       uptime=90000.0, smi=hang)
    assert doc["status"] == "UNKNOWN" and "fabric" not in doc["failed_rules"], doc
    assert any(u.startswith("fabric: ") for u in doc["unknown"])
    assert updates(argv) == []  # UNKNOWN neither drains nor resumes


APPS = r"--query-compute-apps=gpu_bus_id,pid,process_name --format=csv,noheader"


def test_h2_the_idle_timer_runs_the_memory_test_only_when_no_process_uses_a_gpu(tmp_path: Path) -> None:
    memtest = ["--memtest", "--memtest-if-idle", "--memtest-command", f"{FAKES / 'dcgmi'} diag -r memory"]
    idle = overlay(tmp_path / "idle", GPU / "h100-sxm-8gpu", "nvidia-smi", [{"args": APPS, "stdout": "apps.csv"}],
                   {"apps.csv": ""})
    doc, argv, _ = run(tmp_path / "a", idle, *memtest, uptime=90000.0)
    assert doc["status"] == "OK" and ["diag", "-r", "memory"] in argv, (doc, argv)
    busy = overlay(tmp_path / "busy", GPU / "h100-sxm-8gpu", "nvidia-smi", [{"args": APPS, "stdout": "apps.csv"}],
                   {"apps.csv": "00000000:1B:00.0, 4242, python3\n"})
    doc, argv, _ = run(tmp_path / "b", busy, *memtest, uptime=90000.0)
    assert ["diag", "-r", "memory"] not in argv and any("memtest: skipped" in n for n in doc["notes"]), doc


def test_h2_the_idle_timer_is_off_by_default_and_never_cut_at_the_health_deadline() -> None:
    from builder.compose import compose
    from builder.compose.params import parse_sets
    from builder.definitions.load import load_tree

    def layer(*sets: str) -> Any:
        plan = compose(load_tree(ROOT), "node-minimal", "v100-slurm", parse_sets(list(sets)))
        (step,) = [s for s in plan.steps if s.layer == "gpu-health"]
        return step

    assert "enable nodeforge-gpu-memtest.timer" not in layer().apply
    step = layer("gpu-health.memtest_interval=1d", "gpu-health.memtest_timeout=900")
    assert "systemctl enable nodeforge-gpu-memtest.timer" in step.apply
    unit = next(f.content for f in step.files if f.path == "/etc/systemd/system/nodeforge-gpu-memtest.service")
    assert "--memtest --memtest-if-idle --drain no --deadline 960 " in unit and "TimeoutStartSec=1020" in unit
