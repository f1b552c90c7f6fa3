"""nodeforge-gpu-health (layers/gpu-health) against recorded nvidia-smi, dmesg, dcgmi and scontrol output.

Every rule fires on a failing fixture (tests/fixtures/gpu/health-<rule>/) and stays quiet on the healthy
machines (h100-sxm-8gpu, h200-sxm-8gpu, a100-pcie-1gpu); the drain and resume commands are read back from
the fakes' call log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.fake_tools import FAKES, Calls, fake_tools, merge, program_env
from support.metrics import assert_promtool_accepts
from support.programs import load_program
from support.trees import nodeforge, scratch_image, tree_with_layers

ROOT = Path(__file__).resolve().parent.parent
FILES = ROOT / "layers" / "gpu-health" / "files"
SCRIPT = FILES / "gpu-health.py"
POLICY = ROOT / "layers" / "node-lib" / "files" / "xid-policy.tsv"  # the node's one Xid policy
EPILOG = FILES / "gpu-health-epilog"
GPU = ROOT / "tests" / "fixtures" / "gpu"
FIXTURES = ROOT / "tests" / "fixtures"
MEMTEST = f"{FAKES / 'dcgmi'} diag -r memory"

RULES: tuple[str, ...] = load_program(SCRIPT).RULES


class Run:
    def __init__(self, rc: int, stdout: str, calls: Calls) -> None:
        self.rc, self.stdout, self.calls = rc, stdout, calls

    @property
    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.stdout)
        return doc

    def argv(self, tool: str) -> list[list[str]]:
        return self.calls.argv(tool)

    def updates(self) -> list[list[str]]:
        return [a for a in self.argv("scontrol") if a[:1] == ["update"]]


def scenario(tmp: Path, gpu: str, slurm: str = "idle") -> Path:
    """One fake-tool scenario from a GPU machine and a Slurm node state (their files side by side)."""
    return merge(tmp, GPU / gpu, FIXTURES / f"health-slurm-{slurm}")


def check(tmp: Path, gpu: str, *args: str, slurm: str = "idle", uptime: float = 90000.0, json_out: bool = True,
          nvidia_smi: str | None = None) -> Run:
    fixture = scenario(tmp, gpu, slurm)
    proc = tmp / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "uptime").write_text(f"{uptime:.2f} 1400000.00\n")
    env, calls = fake_tools(fixture, tmp)
    smi = nvidia_smi or str(FAKES / "nvidia-smi")
    argv = [sys.executable, str(SCRIPT), "--config", os.devnull, "--nvidia-smi", smi,
            "--scontrol", str(FAKES / "scontrol"), "--dmesg-command", str(FAKES / "dmesg"),
            "--xid-policy", str(POLICY), "--proc-root", str(proc), "--node", "gpu01", "--drain", "yes",
            *(["--json"] if json_out else []), *args]
    proc_ = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc_.stderr == "", proc_.stderr
    return Run(proc_.returncode, proc_.stdout, calls)


# --- quiet on healthy machines ------------------------------------------------------------------------------------

HEALTHY = [
    ("h100-sxm-8gpu", ["--expected-gpus", "8", "--fabric", "check", "--memtest", "--memtest-command", MEMTEST]),
    ("h200-sxm-8gpu", ["--expected-gpus", "8", "--fabric", "check", "--memtest", "--memtest-command", MEMTEST]),
    ("a100-pcie-1gpu", ["--expected-gpus", "1"]),
]


@pytest.mark.parametrize(("gpu", "args"), HEALTHY, ids=[h[0] for h in HEALTHY])
def test_healthy_machine_passes_every_rule(tmp_path: Path, gpu: str, args: list[str]) -> None:
    run = check(tmp_path, gpu, *args)
    doc = run.doc
    assert run.rc == 0 and doc["status"] == "OK", doc
    assert doc["findings"] == [] and doc["failed_rules"] == [] and doc["unknown"] == []
    assert doc["gpus"] == int(args[1])
    assert run.updates() == [], "a healthy idle node must not be drained or resumed"
    queries = [a[0].split(",")[2] for a in run.argv("nvidia-smi") if a[0].startswith("--query-gpu=")]
    # one nvidia-smi query for every GPU's data (and one for the fabric: H4), not one per GPU
    assert queries == ["name", "fabric.state"] if "--fabric" in args else ["name"], queries
    assert not [a for a in run.argv("nvidia-smi") if "-i" in a]


def test_application_xids_are_ignored_not_faults(tmp_path: Path) -> None:
    doc = check(tmp_path, "h100-sxm-8gpu").doc
    assert doc["status"] == "OK"
    assert {(x["xid"], x["count"]) for x in doc["ignored_xids"]} == {(13, 2), (43, 1)}


# --- every rule fires on its failing fixture -----------------------------------------------------------------------

# (scenario, rule, extra options, exit status, drains)
FIRING = [
    ("health-xid", "xid", [], 2, True),
    ("health-xid-reset", "xid", [], 2, True),
    ("health-nvrm", "nvrm", [], 2, True),
    ("health-nvidia-smi", "nvidia-smi", [], 2, True),
    ("health-gpu-count", "gpu-count", ["--expected-gpus", "8"], 2, True),
    ("health-remap-failure", "remap-failure", [], 2, True),
    ("health-ecc-volatile", "ecc-volatile", [], 2, True),
    ("health-remap-pending", "remap-pending", [], 2, True),
    ("health-retired-pages", "retired-pages", ["--expected-gpus", "4"], 2, True),
    ("health-fabric", "fabric", ["--fabric", "check"], 2, True),
    ("health-memtest", "memtest", ["--memtest", "--memtest-command", MEMTEST], 2, True),
    ("health-pcie-width", "pcie-width", [], 2, True),
    ("health-pcie-gen", "pcie-gen", [], 2, True),
    ("health-persistence", "persistence", [], 1, False),  # H3: a latency problem, not a fault
    ("health-ecc-aggregate", "ecc-aggregate", [], 1, False),
    ("health-throttle", "throttle", [], 1, False),
]


def test_every_rule_has_a_failing_fixture() -> None:
    assert {case[1] for case in FIRING} == set(RULES)


@pytest.mark.parametrize(("gpu", "rule", "args", "rc", "drains"), FIRING, ids=[f"{c[1]}:{c[0]}" for c in FIRING])
def test_rule_fires(tmp_path: Path, gpu: str, rule: str, args: list[str], rc: int, drains: bool) -> None:
    run = check(tmp_path, gpu, *args)
    doc = run.doc
    assert run.rc == rc and doc["exit_code"] == rc, doc
    assert rule in doc["failed_rules"]
    updates = run.updates()
    if drains:
        assert len(updates) == 1, updates
        update = updates[0]
        assert update[:3] == ["update", "NodeName=gpu01", "State=DRAIN"]
        assert update[3].startswith(f"Reason=gpu-health: {rule}: "), update
        assert "\n" not in update[3] and len(update[3]) <= 257
    else:
        assert updates == [], "a WARNING never drains"


def test_rule_details_name_the_gpu(tmp_path: Path) -> None:
    doc = check(tmp_path, "health-pcie-gen").doc
    (gen,) = [f for f in doc["findings"] if f["rule"] == "pcie-gen"]
    assert gen["gpu"] == "GPU 2 (00000000:52:00.0)" and "Gen4, expected Gen5" in gen["detail"]
    # GPU 5 idles at Gen1: idle GPUs train their link down, so that is a note, not a finding
    assert any("GPU 5" in n and "idle" in n for n in doc["notes"])


def test_retired_pages_pending_and_over_limit(tmp_path: Path) -> None:
    doc = check(tmp_path, "health-retired-pages").doc
    gpus = {f["gpu"] for f in doc["findings"] if f["rule"] == "retired-pages"}
    assert gpus == {"GPU 1 (00000000:1C:00.0)", "GPU 2 (00000000:88:00.0)"}
    assert check(tmp_path / "b", "health-retired-pages", "--retired-pages-max", "100").doc["failed_rules"] == [
        "retired-pages"]  # the pending one still counts


def test_the_shared_failing_node(tmp_path: Path) -> None:
    run = check(tmp_path, "h100-sxm-8gpu-failing", "--expected-gpus", "8")
    doc = run.doc
    assert run.rc == 2
    assert set(doc["failed_rules"]) == {"xid", "ecc-volatile", "remap-pending", "pcie-gen", "ecc-aggregate",
                                        "throttle"}
    xids = {f["detail"].split(" x")[0]: f["severity"] for f in doc["findings"] if f["rule"] == "xid"}
    assert xids == {"GPU 6 (00000000:D1:00.0) Xid 48": "CRITICAL", "GPU 6 (00000000:D1:00.0) Xid 63": "CRITICAL",
                    "GPU 6 (00000000:D1:00.0) Xid 94": "WARNING"}  # 94: contained, the application restarts
    assert [u[3].split(":")[1].strip() for u in run.updates()] == ["xid"]


def test_text_output_is_nagios_style(tmp_path: Path) -> None:
    run = check(tmp_path, "health-xid", json_out=False)
    first = run.stdout.splitlines()[0]
    assert run.rc == 2 and first.startswith("GPU-HEALTH CRITICAL - xid: ") and "| status=2" in first
    assert "Xid 79" in first


# --- policy and parameters ----------------------------------------------------------------------------------------

def test_xid_policy_override_turns_a_reset_into_a_warning(tmp_path: Path) -> None:
    run = check(tmp_path, "health-xid-reset", "--xid-warn", "74")
    assert run.rc == 1 and run.doc["failed_rules"] == ["xid"] and run.updates() == []


def test_xid_window_leaves_out_old_events(tmp_path: Path) -> None:
    # the Xid 79 is logged at 86012.3 s after boot
    old = check(tmp_path / "old", "health-xid", "--xid-window-seconds", "60", uptime=86100.0)
    assert "xid" not in old.doc["failed_rules"]
    recent = check(tmp_path / "recent", "health-xid", "--xid-window-seconds", "120", uptime=86100.0)
    assert "xid" in recent.doc["failed_rules"]


def test_kernel_log_from_a_file(tmp_path: Path) -> None:
    run = check(tmp_path, "health-nvrm", "--kernel-log", str(GPU / "health-xid" / "health-dmesg.txt"))
    assert "xid" in run.doc["failed_rules"] and "nvrm" not in run.doc["failed_rules"]
    assert run.argv("dmesg") == []


def test_journal_short_monotonic_lines_count_too(tmp_path: Path) -> None:
    # journalctl -k -o short-monotonic: "[seconds] host kernel: message"
    dmesg = (GPU / "health-xid" / "health-dmesg.txt").read_text().splitlines()
    journal = tmp_path / "journal.txt"
    journal.write_text("".join(re.sub(r"^(\[[ 0-9.]+\]) ", r"\1 gpu01 kernel: ", line) + "\n" for line in dmesg))
    run = check(tmp_path, "health-nvidia-smi", "--kernel-log", str(journal), "--xid-window-seconds", "120",
                uptime=86100.0)
    assert "xid" in run.doc["failed_rules"]
    old = check(tmp_path / "old", "health-nvidia-smi", "--kernel-log", str(journal), "--xid-window-seconds", "60",
                uptime=86100.0)
    assert "xid" not in old.doc["failed_rules"]


def test_a_warning_rule_can_be_made_critical(tmp_path: Path) -> None:
    run = check(tmp_path, "health-throttle", "--warn-rules", "ecc-aggregate")
    assert run.rc == 2 and run.updates()[0][3].startswith("Reason=gpu-health: throttle: ")
    # the software power cap on GPU 1 is not in the default set of counted reasons
    assert [f["gpu"] for f in run.doc["findings"]] == ["GPU 3 (00000000:61:00.0)"]


def test_skipped_rule_stays_quiet(tmp_path: Path) -> None:
    run = check(tmp_path, "health-persistence", "--skip-rules", "persistence")
    assert run.rc == 0 and run.updates() == []


def test_config_file_and_its_unknown_keys(tmp_path: Path) -> None:
    conf = tmp_path / "gpu-health.conf"
    conf.write_text("[gpu-health]\nexpected-gpus = 8\nwarn-rules = ecc-aggregate, throttle\n")
    run = check(tmp_path / "a", "health-gpu-count", "--config", str(conf))
    assert run.doc["failed_rules"] == ["gpu-count"]
    conf.write_text("[gpu-health]\nexpected-gpu = 8\n")
    bad = subprocess.run([sys.executable, str(SCRIPT), "--config", str(conf)], capture_output=True, text=True,
                         env=program_env(), check=False)
    assert bad.returncode == 2 and "unknown option 'expected-gpu'" in bad.stderr


def test_malformed_policy_is_unknown(tmp_path: Path) -> None:
    policy = tmp_path / "policy.tsv"
    policy.write_text("79\treboot\tfell off\n")
    run = check(tmp_path, "health-xid", "--xid-policy", str(policy), json_out=False)
    assert run.rc == 3 and "action one of drain, reset, warn, ignore" in run.stdout


# --- Slurm: drain what it finds, resume only its own drain -------------------------------------------------------

def test_resumes_its_own_drain_when_healthy(tmp_path: Path) -> None:
    run = check(tmp_path, "h100-sxm-8gpu", slurm="drained-by-gpu-health")
    assert run.rc == 0
    assert run.updates() == [["update", "NodeName=gpu01", "State=RESUME"]]


def test_leaves_a_drain_it_did_not_set(tmp_path: Path) -> None:
    healthy = check(tmp_path / "a", "h100-sxm-8gpu", slurm="drained-by-admin")
    assert healthy.rc == 0 and healthy.updates() == []
    failing = check(tmp_path / "b", "health-xid", slurm="drained-by-admin")
    assert failing.rc == 2 and failing.updates() == []
    assert "another reason" in failing.doc["slurm"]["why"]


def test_warning_resumes_its_own_drain(tmp_path: Path) -> None:
    run = check(tmp_path, "health-throttle", slurm="drained-by-gpu-health")
    assert run.rc == 1 and run.updates() == [["update", "NodeName=gpu01", "State=RESUME"]]


def test_unknown_neither_drains_nor_resumes(tmp_path: Path) -> None:
    run = check(tmp_path, "h100-sxm-8gpu", slurm="drained-by-gpu-health", nvidia_smi=str(tmp_path / "absent"))
    assert run.rc == 3 and run.doc["status"] == "UNKNOWN" and run.updates() == []


def test_no_drain_option(tmp_path: Path) -> None:
    run = check(tmp_path, "health-xid", "--drain", "no")
    assert run.rc == 2 and run.argv("scontrol") == []


# --- GPU reset: only when asked, only when free -------------------------------------------------------------------

def test_reset_refused_while_a_process_uses_the_gpu(tmp_path: Path) -> None:
    run = check(tmp_path, "health-remap-pending", "--reset")
    assert run.doc["resets"] == [{"gpu": "GPU 6 (00000000:D1:00.0)", "done": False,
                                  "why": "refused: in use by pid 51022"}]
    assert not [a for a in run.argv("nvidia-smi") if a[:1] == ["-r"]]


def test_reset_of_a_free_gpu(tmp_path: Path) -> None:
    run = check(tmp_path, "health-xid-reset", "--reset")
    assert [a for a in run.argv("nvidia-smi") if a[:1] == ["-r"]] == [["-r", "-i", "3"]]
    assert run.doc["resets"][0]["done"] is True
    # the node is drained before the reset
    order = [c["tool"] if c["argv"][:1] != ["-r"] else "reset" for c in run.calls]
    assert order.index("reset") > max(i for i, t in enumerate(order) if t == "scontrol")


def test_no_reset_unless_asked(tmp_path: Path) -> None:
    run = check(tmp_path, "health-xid-reset")
    assert run.doc["resets"] == [] and not [a for a in run.argv("nvidia-smi") if a[:1] == ["-r"]]


# --- the 60 s contract ---------------------------------------------------------------------------------------------

def test_a_hung_nvidia_smi_is_cut_off_and_drains(tmp_path: Path) -> None:
    hang = tmp_path / "nvidia-smi"
    hang.write_text("#!/bin/sh\nexec sleep 600\n")
    hang.chmod(0o755)
    run = check(tmp_path, "h100-sxm-8gpu", "--command-timeout", "1", nvidia_smi=str(hang))
    assert run.rc == 2 and "no answer within 1 s" in run.doc["findings"][0]["detail"]
    assert run.updates()[0][3].startswith("Reason=gpu-health: nvidia-smi: ")


def test_every_command_has_a_timeout_and_nothing_sleeps() -> None:
    source = "".join(p.read_text() for p in (SCRIPT, *FILES.glob("nodeforge_gpu_health*.py")))
    assert "sleep(" not in source
    assert source.count("subprocess.run(") == 1 and "timeout=limit" in source


# --- outputs for other callers ------------------------------------------------------------------------------------

def test_json_file_and_textfile_metric(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = check(tmp_path, "health-xid", "--json-file", str(out / "gpu-health.json"), "--textfile", str(out))
    assert json.loads((out / "gpu-health.json").read_text())["failed_rules"] == run.doc["failed_rules"]
    prom = (out / "gpu_health.prom").read_text()
    assert "nodeforge_gpu_health_status 2\n" in prom
    assert 'nodeforge_gpu_health_rule_status{rule="xid"} 2\n' in prom
    assert 'nodeforge_gpu_health_rule_status{rule="throttle"} 0\n' in prom
    assert_promtool_accepts(prom)


def test_epilog_runs_the_memory_test_and_fails_the_job_end(tmp_path: Path) -> None:
    fixture = scenario(tmp_path, "health-memtest")
    conf = tmp_path / "gpu-health.conf"
    conf.write_text(f"[gpu-health]\nnvidia-smi = {FAKES / 'nvidia-smi'}\ndmesg-command = {FAKES / 'dmesg'}\n"
                    f"xid-policy = {POLICY}\nmemtest-command = {MEMTEST}\nscontrol = {FAKES / 'scontrol'}\n")
    env, calls = fake_tools(fixture, tmp_path, NODEFORGE_GPU_HEALTH=f"{sys.executable} {SCRIPT}",
                            NODEFORGE_GPU_HEALTH_CONFIG=str(conf), SLURM_JOB_EXIT_CODE="256")  # the job failed
    run = subprocess.run([str(EPILOG)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "memtest" in run.stdout
    assert {c["tool"] for c in calls()} >= {"dcgmi", "nvidia-smi"}
    assert not calls("scontrol"), "an epilog leaves draining to Slurm"


def bench_healthy_8gpu(runs: int = 5) -> float:
    """Seconds one health check takes against the healthy 8-GPU fixture (the median of `runs`)."""
    import tempfile

    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.monotonic()
            check(Path(tmp), "h100-sxm-8gpu", "--expected-gpus", "8", "--fabric", "check")
            times.append(time.monotonic() - start)
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    print(f"gpu-health, healthy 8-GPU fixture: {bench_healthy_8gpu():.3f} s")


# --- the layer: rendered settings drive the program ----------------------------------------------------------------

SCRATCH_IMAGE = scratch_image("health-scratch", "a node with the gpu-health layer", ["base", "gpu-health"])
HGX = "name: hgx\nsummary: 8-GPU NVSwitch nodes\nsite:\n  gpu: {model: H100-SXM5-80GB, count: 8}\n  fabric: nvswitch\n"


@pytest.fixture
def health_tree(tmp_path: Path) -> Path:
    """A tree of its own: the layers the image needs, the image, an 8-GPU NVSwitch site."""
    return tree_with_layers(tmp_path, ("base", "node-lib", "gpu-present", "gpu-health"),
                            {"health-scratch": SCRATCH_IMAGE}, {"hgx": HGX})


def test_rendered_settings_drive_the_check(health_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "render"
    proc = nodeforge(health_tree, "render", "health-scratch", str(out), "-c", "hgx")
    assert proc.returncode == 0, proc.stderr
    (conf,) = out.glob("*-gpu-health/root/etc/nodeforge/gpu-health.conf")
    text = conf.read_text()
    assert "expected-gpus = 8\n" in text and "fabric = check\n" in text  # from the site
    # the site's GPU count and fabric come from the settings file alone
    count = check(tmp_path / "a", "health-gpu-count", "--config", str(conf), "--textfile", str(tmp_path / "tf"))
    assert count.doc["failed_rules"] == ["gpu-count"]
    fabric = check(tmp_path / "b", "health-fabric", "--config", str(conf), "--textfile", str(tmp_path / "tf"))
    assert fabric.doc["failed_rules"] == ["fabric"]
    healthy = check(tmp_path / "c", "h100-sxm-8gpu", "--config", str(conf), "--textfile", str(tmp_path / "tf"))
    assert healthy.rc == 0
    unit = next(out.glob("*-gpu-health/root/etc/systemd/system/nodeforge-gpu-health.service")).read_text()
    assert "ExecCondition=/bin/sh -c '/usr/lib/nodeforge/nvidia-gpu-present || exit 254'" in unit
    assert "SuccessExitStatus=1 2" in unit and "--drain no" in unit


def test_a_deadline_shorter_than_one_command_is_rejected(health_tree: Path) -> None:
    proc = nodeforge(health_tree, "plan", "health-scratch", "--set", "gpu-health.deadline=5",
                     "--set", "gpu-health.command_timeout=10")
    assert proc.returncode == 2 and "command_timeout (10 s) is longer than the whole deadline (5 s)" in proc.stderr
    over = nodeforge(health_tree, "plan", "health-scratch", "--set", "gpu-health.deadline=90")
    assert over.returncode == 2 and "expected a value <= 55, found 90" in over.stderr
