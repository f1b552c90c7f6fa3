"""gpu-power: the boot-time power/clock script and the governor against recorded nvidia-smi output.

The script runs against the fake nvidia-smi (tests/fakes/bin/replay) on each scenario under
tests/fixtures/gpu/; the commands it sent are read back from the fake's log and asserted
exactly. No engine is needed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.fake_tools import fake, fake_tools
from support.fake_tools import overlay as overlay_scenario
from support.programs import load_program
from support.trees import nodeforge, scratch_image, tree_with_layers

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "layers/gpu-power/files/nodeforge-gpu-power"
GPU = ROOT / "tests/fixtures/gpu"
POWER_QUERY = ("--query-gpu=index,uuid,pci.bus_id,power.limit,enforced.power.limit,power.default_limit,"
               "power.min_limit,power.max_limit,clocks.max.graphics --format=csv,noheader,nounits")


class Run:
    def __init__(self, proc: subprocess.CompletedProcess[str], calls: list[list[str]]) -> None:
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.calls = calls

    @property
    def settings(self) -> list[list[str]]:
        """The setting commands sent (everything but queries)."""
        return [c for c in self.calls if not c[0].startswith("--query-gpu=")]


def run(scenario: Path, work: Path, *args: str) -> Run:
    env, calls = fake_tools(scenario, work, base={"PATH": "/usr/bin:/bin"})
    proc = subprocess.run([sys.executable, str(SCRIPT), *args[:1], "--nvidia-smi", fake("nvidia-smi"), *args[1:]],
                          capture_output=True, text=True, env=env, timeout=120)
    return Run(proc, calls.argv())


def overlay(work: Path, scenario: str, rules: list[dict[str, Any]], files: dict[str, str]) -> Path:
    """A copy of a recorded scenario with test rules that answer first (00-test.json sorts first)."""
    return overlay_scenario(work, GPU / scenario, "nvidia-smi", rules, files)


def with_limits(scenario: str, limits: dict[int, float]) -> str:
    """The recorded power query of a scenario with power.limit (and enforced) of some GPUs changed."""
    rows = []
    for line in (GPU / scenario / "query-gpu-power.csv").read_text().splitlines():
        fields = line.split(", ")
        index = int(fields[0])
        if index in limits:
            fields[3] = fields[4] = f"{limits[index]:.2f}"
        rows.append(", ".join(fields))
    return "\n".join(rows) + "\n"


def readback_rules(scenario: str, limits: dict[int, float]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    return ([{"args": POWER_QUERY.replace(".", r"\."), "sequence": ["query-gpu-power.csv", "test-readback.csv"]}],
            {"test-readback.csv": with_limits(scenario, limits)})


# --- apply ------------------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", ["h100-sxm-8gpu", "h200-sxm-8gpu"])
def test_apply_sets_every_gpu_and_verifies_the_read_back(scenario: str, tmp_path: Path) -> None:
    r = run(GPU / scenario, tmp_path, "apply", "--power-limit", "500", "--clocks", "1410,1980")
    assert r.rc == 0, r.out + r.err
    assert r.settings == ([["-i", str(i), "-lgc", "1410,1980"] for i in range(8)]
                          + [["-i", str(i), "-pl", "500"] for i in range(8)])
    # one query before, one read-back after
    assert [c[0].startswith("--query-gpu=") for c in r.calls].count(True) == 2
    assert r.out.count("power limit verified at 500 W") == 8


def test_single_gpu_clock_maximum_clamped_to_the_gpu(tmp_path: Path) -> None:
    r = run(GPU / "a100-pcie-1gpu", tmp_path, "apply", "--power-limit", "250", "--clocks", "1410,1980")
    assert r.rc == 0, r.out + r.err
    assert r.settings == [["-i", "0", "-lgc", "1410,1410"], ["-i", "0", "-pl", "250"]]
    assert "locked clock maximum 1980 MHz is over the GPU's maximum 1410 MHz: using 1410 MHz" in r.out


def test_limit_over_the_maximum_is_clamped_to_it(tmp_path: Path) -> None:
    rules, files = readback_rules("h100-sxm-8gpu", {})  # read-back: every GPU at its 700 W maximum
    scenario = overlay(tmp_path, "h100-sxm-8gpu", rules, files)
    r = run(scenario, tmp_path, "apply", "--power-limit", "800")
    assert r.rc == 0, r.out + r.err
    assert r.settings == [["-i", str(i), "-pl", "700"] for i in range(8)]
    assert r.out.count("800 W is over the GPU's maximum 700 W: using 700 W") == 8


def test_limit_under_the_minimum_is_clamped_to_it(tmp_path: Path) -> None:
    rules, files = readback_rules("a100-pcie-1gpu", {0: 150})
    scenario = overlay(tmp_path, "a100-pcie-1gpu", rules, files)
    r = run(scenario, tmp_path, "apply", "--power-limit", "100")
    assert r.rc == 0, r.out + r.err
    assert r.settings == [["-i", "0", "-pl", "150"]]
    assert "100 W is under the GPU's minimum 150 W: using 150 W" in r.out


def test_per_gpu_overrides_win_and_zero_leaves_a_gpu_alone(tmp_path: Path) -> None:
    limits = {i: 500.0 for i in range(8)}
    limits.update({3: 450.0, 5: 700.0})
    rules, files = readback_rules("h100-sxm-8gpu", limits)
    scenario = overlay(tmp_path, "h100-sxm-8gpu", rules, files)
    r = run(scenario, tmp_path, "apply", "--power-limit", "500", "--override", "3:450", "--override", "5:0",
            "--clock-override", "2:1200,1600")
    assert r.rc == 0, r.out + r.err
    assert r.settings == [["-i", "2", "-lgc", "1200,1600"]] + [
        ["-i", str(i), "-pl", "450" if i == 3 else "500"] for i in range(8) if i != 5]


def test_a_gpu_that_refuses_its_limit_fails_after_bounded_retries(tmp_path: Path) -> None:
    r = run(GPU / "h100-sxm-8gpu-failing", tmp_path, "apply", "--power-limit", "500", "--attempts", "2",
            "--retry-delay", "0")
    assert r.rc == 1
    assert r.settings == [["-i", str(i), "-pl", "500"] for i in range(8)] + [["-i", "3", "-pl", "500"]]
    assert ("FAILED gpu 3 (GPU-9ce2683c-1b63-86c1-157b-347b0de67197, 00000000:61:00.0): power limit reads back "
            "700 W, wanted 500 W after 2 attempt(s)") in r.out
    assert r.out.count("power limit verified at 500 W") == 7


def test_a_read_back_that_differs_is_a_failure(tmp_path: Path) -> None:
    rules, files = readback_rules("h100-sxm-8gpu", {i: (650.0 if i == 0 else 500.0) for i in range(8)})
    scenario = overlay(tmp_path, "h100-sxm-8gpu", rules, files)
    r = run(scenario, tmp_path, "apply", "--power-limit", "500", "--attempts", "1")
    assert r.rc == 1
    assert "FAILED gpu 0 (GPU-895b45b2-e3ec-37d8-e6e3-74464f7ee199, 00000000:1B:00.0): power limit reads back 650 W" \
        in r.out


def test_dry_run_sends_no_setting_command(tmp_path: Path) -> None:
    r = run(GPU / "h100-sxm-8gpu", tmp_path, "apply", "--dry-run", "--power-limit", "900", "--clocks", "1410,1980")
    assert r.rc == 0, r.out + r.err
    assert r.settings == []
    assert len(r.calls) == 1  # the query, nothing else
    assert "dry-run: would run nvidia-smi -i 7 -pl 700" in r.out
    assert "dry-run: would run nvidia-smi -i 0 -lgc 1410,1980" in r.out


def test_nothing_configured_changes_nothing(tmp_path: Path) -> None:
    r = run(GPU / "h100-sxm-8gpu", tmp_path, "apply")
    assert r.rc == 0 and r.settings == []
    assert "no power limit configured" in r.out


def test_driver_not_loaded_is_a_failure_with_nvidia_smi_s_words(tmp_path: Path) -> None:
    message = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n")
    scenario = overlay(tmp_path, "h100-sxm-8gpu", [{"args": ".*", "stdout": "test-no-driver.txt", "exit": 9}],
                       {"test-no-driver.txt": message})
    r = run(scenario, tmp_path, "apply", "--power-limit", "500")
    assert r.rc == 1 and r.settings == []
    assert "exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" in r.out


@pytest.mark.parametrize("args", [["--override", "3:abc"], ["--clocks", "1980,1410"], ["--power-limit", "-5"]])
def test_malformed_arguments_are_usage_errors(args: list[str], tmp_path: Path) -> None:
    r = run(GPU / "h100-sxm-8gpu", tmp_path, "apply", *args)
    assert r.rc == 2 and r.calls == []
    assert "nodeforge-gpu-power:" in r.err


# --- governor ---------------------------------------------------------------------------------

def step_governor(scenario: Path, work: Path, steps: int, *args: str) -> list[Run]:
    runs = []
    seen = 0
    for _ in range(steps):
        r = run(scenario, work, "govern", "--once", "--state", str(work / "governor.json"), *args)
        assert r.rc == 0, r.out + r.err
        r.calls, seen = r.calls[seen:], len(r.calls)  # this step's calls only (the log accumulates)
        runs.append(r)
    return runs


def test_governor_follows_a_recorded_utilisation_sequence(tmp_path: Path) -> None:
    runs = step_governor(GPU / "h100-sxm-8gpu", tmp_path, 7, "--step", "100")
    assert [r.settings for r in runs] == [
        [], [], [["-i", "0", "-pl", "600"]],           # GPU 0: three idle samples, one step down
        [], [], [["-i", "0", "-pl", "500"]],           # three more, another step
        [["-i", "0", "-pl", "700"]],                   # work arrives: straight back to the ceiling
    ]
    # GPU 2 flaps between 10 % and 45 %: inside the band, the idle count restarts, nothing is sent
    assert all("gpu 2 " not in " ".join(c) for r in runs for c in r.settings)
    assert "utilisation 45 % inside 20-60 %" in runs[1].out
    # GPU 3: a job set 450 W at the second sample: the governor leaves it alone from then on
    for r in runs[1:]:
        assert "gpu 3 GPU-9ce2683c-1b63-86c1-157b-347b0de67197: util" in r.out
        assert "yield (limit 450 W was set by someone else (governor last set 700 W)" in r.out
    # every GPU gets one decision line per sample
    assert all(sum(line.startswith("gpu ") for line in r.out.splitlines()) == 8 for r in runs)


def test_governor_lowers_every_idle_gpu_of_the_node(tmp_path: Path) -> None:
    runs = step_governor(GPU / "h200-sxm-8gpu", tmp_path, 4, "--step", "100")
    assert [r.settings for r in runs] == [[], [], [["-i", str(i), "-pl", "600"] for i in range(8)], []]


def test_governor_on_a_single_gpu_node(tmp_path: Path) -> None:
    runs = step_governor(GPU / "a100-pcie-1gpu", tmp_path, 4, "--step", "100")
    assert [r.settings for r in runs] == [[], [], [["-i", "0", "-pl", "200"]], []]


def test_governor_dry_run_sends_nothing(tmp_path: Path) -> None:
    runs = step_governor(GPU / "h100-sxm-8gpu", tmp_path, 3, "--step", "100", "--dry-run")
    assert [r.settings for r in runs] == [[], [], []]
    assert "dry-run: would run nvidia-smi -i 0 -pl 600" in runs[2].out


def gpu_row(util: float, limit: float, low: float = 200, high: float = 700, default: float = 700) -> dict[str, Any]:
    return {"index": "0", "uuid": "GPU-x", "utilization.gpu": str(util), "power.draw": "90.00",
            "power.limit": f"{limit:.2f}", "power.default_limit": f"{default:.2f}",
            "power.min_limit": f"{low:.2f}", "power.max_limit": f"{high:.2f}"}


def settings(mod: ModuleType, **kw: Any) -> Any:
    s = mod.Settings()
    s.down_samples = 1
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def test_governor_never_goes_under_the_gpu_minimum_or_the_floor() -> None:
    mod = load_program(SCRIPT)
    s = settings(mod, step_w=100)
    state: dict[str, Any] = {}
    d = mod.decide(gpu_row(0, 250), state, s)
    assert (d.action, d.target) == ("lower", 200)  # not 150: the GPU's minimum
    d = mod.decide(gpu_row(0, 200), {"last_set": 200}, s)
    assert (d.action, d.target) == ("hold", None) and "already at the floor 200 W" in d.reason
    d = mod.decide(gpu_row(0, 350), {"last_set": 350}, settings(mod, step_w=100, floor_w=300))
    assert (d.action, d.target) == ("lower", 300)
    d = mod.decide(gpu_row(0, 350), {"last_set": 350}, settings(mod, step_w=100, floor_w=100))
    assert (d.action, d.target) == ("lower", 250)  # a floor under the GPU's minimum is the minimum


def test_governor_ceiling_is_the_configured_limit_else_the_gpu_maximum() -> None:
    mod = load_program(SCRIPT)
    d = mod.decide(gpu_row(95, 300), {"last_set": 300}, settings(mod))
    assert (d.action, d.target) == ("raise", 700)
    d = mod.decide(gpu_row(95, 300), {"last_set": 300}, settings(mod, power_limit_w=500))
    assert (d.action, d.target) == ("raise", 500)
    d = mod.decide(gpu_row(95, 300), {"last_set": 300}, settings(mod, raise_step_w=50))
    assert (d.action, d.target) == ("raise", 350)


def test_governor_hands_back_when_the_limit_returns_to_its_baseline() -> None:
    mod = load_program(SCRIPT)
    s = settings(mod)
    state: dict[str, Any] = {"last_set": 600, "low": 0, "high": 0}
    assert mod.decide(gpu_row(0, 450), state, s).action == "yield"
    assert state["last_set"] == 600
    d = mod.decide(gpu_row(0, 700), state, s)  # an epilog put the default back
    assert d.action == "lower" and "governing again" in d.reason and d.target == 650


def test_governor_thresholds_must_leave_a_band(tmp_path: Path) -> None:
    r = run(GPU / "h100-sxm-8gpu", tmp_path, "govern", "--once", "--low-util", "70", "--high-util", "60",
            "--state", str(tmp_path / "s.json"))
    assert r.rc == 2 and "low (70.0) < high (60.0)" in r.err and r.calls == []


# --- the layer --------------------------------------------------------------------------------

SCRATCH_IMAGE = scratch_image("power-scratch", "a node with the gpu-power layer",
                              ["base", {"gpu-power": {"power_limit_w": 500, "power_limit_overrides": ["3:450"]}}])


@pytest.fixture
def power_tree(tmp_path: Path) -> Path:
    """A small tree of its own: the layers this image needs, the image, an empty config."""
    return tree_with_layers(tmp_path, ("base", "node-lib", "gpu-present", "gpu-power"),
                            {"power-scratch": SCRATCH_IMAGE})


def test_rendered_settings_drive_the_script(power_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "render"
    proc = nodeforge(power_tree, "render", "power-scratch", str(out))
    assert proc.returncode == 0, proc.stderr
    (config,) = out.glob("*-gpu-power/root/etc/nodeforge/gpu-power.json")
    unit = next(out.glob("*-gpu-power/root/etc/systemd/system/nodeforge-gpu-power.service")).read_text()
    assert "After=nvidia-persistenced.service" in unit and "ExecCondition=/usr/lib/nodeforge/nvidia-gpu-present" in unit
    r = run(GPU / "h100-sxm-8gpu", tmp_path, "apply", "--config", str(config), "--dry-run")
    assert r.rc == 0, r.out + r.err
    assert "dry-run: would run nvidia-smi -i 3 -pl 450" in r.out
    assert "dry-run: would run nvidia-smi -i 0 -pl 500" in r.out


@pytest.mark.parametrize(("setting", "expected"), [
    ("gpu-power.power_limit_w=2500", "expected a value <= 2000, found 2500"),
    ("gpu-power.governor_low_util=70", "governor_low_util (70) must be under governor_high_util (60)"),
    ('gpu-power.power_limit_overrides=["3:lots"]', "expected a value matching '[0-9]+:[0-9]+', found '3:lots'"),
    ('gpu-power.power_limit_overrides=["3:4500"]', "every item must be INDEX:WATTS with WATTS 0..2000"),
    ('gpu-power.locked_clocks_overrides=["3:1980,1410"]', "MIN,MAX with MIN <= MAX"),
    ("gpu-power.locked_clocks_mhz=1980,1410", "MIN,MAX with MIN <= MAX"),
])
def test_a_wrong_parameter_is_rejected_when_composing(power_tree: Path, setting: str, expected: str) -> None:
    proc = nodeforge(power_tree, "plan", "power-scratch", "--set", setting)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    ok = nodeforge(power_tree, "plan", "power-scratch")
    assert ok.returncode == 0, ok.stderr


def _unit_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_p1_boot_unit_is_never_skipped_for_a_late_device_node(power_tree: Path, tmp_path: Path) -> None:
    """P1: the cap must not be skipped silently. No condition on /dev/nvidia* (user space creates the
    nodes, late), the PCI-bus condition instead; ordered after persistenced, and not Requires= it: a
    persistenced skipped by its own ExecCondition, or whose first start failed, would end this job as
    a failed dependency (systemd's job_fail_dependencies), which is the silent skip again."""
    out = tmp_path / "render"
    proc = nodeforge(power_tree, "render", "power-scratch", str(out))
    assert proc.returncode == 0, proc.stderr
    unit = _unit_lines(next(out.glob("*-gpu-power/root/etc/systemd/system/nodeforge-gpu-power.service")).read_text())
    assert "ExecCondition=/usr/lib/nodeforge/nvidia-gpu-present" in unit
    assert "After=nvidia-persistenced.service" in unit and "Wants=nvidia-persistenced.service" in unit
    assert not [line for line in unit if line.startswith("Condition") and "/dev/" in line], unit
    assert not [line for line in unit if line.startswith(("Requires=", "Requisite=", "BindsTo="))], unit


# --- the recorded captures: the driver the image ships (535) beside 590 ---------------------------

def test_apply_reads_the_same_query_on_the_535_capture(tmp_path: Path) -> None:
    """The unit reads --query-gpu, whose fields are the same on 535 and 590, never -q (labels differ)."""
    r = run(GPU / "h100-sxm-8gpu-535", tmp_path, "apply", "--power-limit", "900", "--dry-run")
    assert r.rc == 0, r.out + r.err
    assert "900 W is over the GPU's maximum 700 W: using 700 W" in r.out and r.settings == []


def test_fixtures_q_labels_differ_between_535_and_590() -> None:
    q535 = (GPU / "h100-sxm-8gpu-535" / "nvidia-smi-q.txt").read_text()
    q590 = (GPU / "h100-sxm-8gpu" / "nvidia-smi-q.txt").read_text()
    assert "Driver Version                            : 535.261.03" in q535
    assert "        Power Draw                        : 612.35 W" in q535 and "Average Power Draw" not in q535
    assert "Average Power Draw" in q590 and "GPU Shutdown T.Limit Temp" in q590
    assert "        Gpu                               : 98 %" in q535 and "GPU Shutdown Temp" in q535
    assert "Clocks Event Reasons Counters" in q590 and "Clocks Event Reasons Counters" not in q535


@pytest.mark.parametrize("scenario", ["h100-sxm-8gpu", "h200-sxm-8gpu", "a100-pcie-1gpu", "h100-sxm-8gpu-535"])
def test_fixtures_q_agrees_with_the_query_csv(scenario: str) -> None:
    """Utilisation, idle reason and SM clock of -q are those of the CSV (a loaded GPU is not idle);
    no capture-file trailer between the GPU blocks of a -q recording."""
    import re

    q = (GPU / scenario / "nvidia-smi-q.txt").read_text()
    assert "####" not in q and "query-gpu" not in q
    csv = GPU / ("h100-sxm-8gpu" if scenario.endswith("-535") else scenario) / "query-gpu-monitoring.csv"
    rows = [line.split(", ") for line in csv.read_text().splitlines() if line.strip()]
    blocks = re.split(r"(?m)^(?=GPU [0-9A-F]{8}:)", q)[1:]
    assert len(blocks) == len(rows)
    for row, block in zip(rows, blocks, strict=True):
        assert block.split()[1] == row[3]
        assert re.search(rf"(?m)^        (GPU|Gpu) +: {row[4]} %$", block), row[3]
        assert re.search(rf"(?m)^        SM +: {row[14]} MHz$", block), row[3]
        idle = re.search(r"(?m)^        Idle +: (.*)$", block)
        assert idle and idle.group(1) == ("Active" if row[4] == "0" else "Not Active")


@pytest.mark.parametrize("scenario", ["h100-sxm-8gpu", "h200-sxm-8gpu", "h100-sxm-8gpu-535"])
def test_fixtures_hopper_retired_pages_are_not_applicable(scenario: str) -> None:
    """Hopper has row remapping, not page retirement: nvidia-smi prints [N/A] for retired_pages.*."""
    lines = (GPU / scenario / "health-query-gpu.csv").read_text().splitlines()
    head = lines[0].split(", ")
    cols = [head.index(c) for c in ("retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count",
                                    "retired_pages.pending")]
    assert all(line.split(", ")[c] == "[N/A]" for line in lines[1:] for c in cols)
