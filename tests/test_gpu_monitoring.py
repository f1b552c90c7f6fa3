"""gpu-monitoring: the textfile collector on recorded nvidia-smi output, and the alert rules under promtool.

The collector runs against the fake nvidia-smi and journalctl (tests/fakes/bin/replay) on each
scenario under tests/fixtures/gpu/. The rules and the scrape configuration are rendered from
the layer with `nodeforge render` (a small tree of its own: base, monitoring, gpu-monitoring)
and checked with promtool from Debian's prometheus package. No engine is needed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.fake_tools import fake, fake_tools, program_env
from support.fake_tools import overlay as overlay_scenario
from support.programs import load_program
from support.trees import nodeforge, scratch_image, tree_with_layers

ROOT = Path(__file__).resolve().parent.parent
COLLECTOR = ROOT / "layers/gpu-monitoring/files/nodeforge-gpu-metrics"
GPU = ROOT / "tests/fixtures/gpu"
SCENARIOS = ["h100-sxm-8gpu", "h200-sxm-8gpu", "a100-pcie-1gpu", "h100-sxm-8gpu-failing"]
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")

# promtool's naming lints that dcgm-exporter's own names and labels trip (modelName is camelCase,
# DCGM counters end in _TOTAL/_COUNTER, not _total): kept for compatibility with DCGM dashboards
DCGM_NAMING_LINTS = (
    "label names should be written in 'snake_case' not 'camelCase'",
    'counter metrics should have "_total" suffix',
    "metric name should not include type 'counter'",
)
SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


# --- running the collector --------------------------------------------------------------------

def collect(scenario: Path, out: Path, *extra: str, sysfs: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The collector on a recorded scenario; the PCI bus is `sysfs` (an empty one unless given)."""
    out.mkdir(parents=True, exist_ok=True)
    if sysfs is None:
        sysfs = out.parent / "no-sysfs"
        sysfs.mkdir(exist_ok=True)
    env, _ = fake_tools(scenario, out.parent, base={"PATH": "/usr/bin:/bin"})
    return subprocess.run([sys.executable, str(COLLECTOR), "--output-dir", str(out), "--hostname", "node1",
                           "--nvidia-smi", fake("nvidia-smi"), "--journalctl", fake("journalctl"),
                           "--sysfs", str(sysfs), *extra], capture_output=True, text=True, env=env, timeout=120)


def samples(text: str) -> dict[tuple[str, str], tuple[dict[str, str], float]]:
    """{(metric, gpu): (labels, value)} of a .prom text."""
    result = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m["labels"]))
        result[(m["name"], labels.get("gpu", ""))] = (labels, float(m["value"]))
    return result


def overlay(work: Path, scenario: str, tool: str, rules: list[dict[str, Any]], files: dict[str, str]) -> Path:
    return overlay_scenario(work, GPU / scenario, tool, rules, files)


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], input=stdin, capture_output=True, text=True, cwd=cwd, timeout=120)


# --- the collector on every scenario ----------------------------------------------------------

@needs_promtool
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_collector_output_passes_promtool_check_metrics(scenario: str, tmp_path: Path) -> None:
    out = tmp_path / "textfile"
    proc = collect(GPU / scenario, out)
    assert proc.returncode == 0, proc.stderr
    text = (out / "nodeforge_gpu.prom").read_text()
    check = promtool("check", "metrics", stdin=text)
    # exit 1 would be a format error; 3 is lint findings only, and those must all be DCGM's naming
    assert check.returncode in (0, 3), check.stdout + check.stderr
    problems = [p for p in (check.stdout + check.stderr).splitlines() if p.strip()]
    assert problems, "expected the DCGM naming lints"
    assert all(any(p.endswith(lint) for lint in DCGM_NAMING_LINTS) for p in problems), problems
    status = promtool("check", "metrics", stdin=(out / "nodeforge_gpu_collector.prom").read_text())
    assert status.returncode == 0 and not (status.stdout + status.stderr).strip()
    for family in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"):
        assert f"# HELP {family} " in text and f"# TYPE {family} " in text


def test_labels_are_index_and_uuid_with_the_device_file_by_minor_number(tmp_path: Path) -> None:
    out = tmp_path / "textfile"
    assert collect(GPU / "h100-sxm-8gpu", out).returncode == 0
    got = samples((out / "nodeforge_gpu.prom").read_text())
    csv = [line.split(", ") for line in (GPU / "h100-sxm-8gpu/query-gpu-monitoring.csv").read_text().splitlines()]
    minors = [2, 3, 0, 1, 6, 7, 4, 5]  # recorded in nvidia-smi-q.txt
    for index in range(8):
        labels, value = got[("DCGM_FI_DEV_GPU_UTIL", str(index))]
        assert labels == {"gpu": str(index), "UUID": csv[index][1], "pci_bus_id": csv[index][3],
                          "device": f"nvidia{minors[index]}", "modelName": "NVIDIA H100 80GB HBM3",
                          "Hostname": "node1"}
        assert value == float(csv[index][4])
    assert got[("DCGM_FI_DEV_FB_USED", "0")][1] == 71234
    assert got[("DCGM_FI_DEV_POWER_USAGE", "0")][1] == 612.35
    assert got[("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "2")][1] == 3
    text = (out / "nodeforge_gpu.prom").read_text()
    assert "# TYPE nodeforge_gpu_xid_total counter" in text and "nodeforge_gpu_xid_total{" not in text  # no Xid


def test_h200_and_single_gpu_identity(tmp_path: Path) -> None:
    for scenario, count, model in (("h200-sxm-8gpu", 8, "NVIDIA H200"), ("a100-pcie-1gpu", 1, "NVIDIA A100 80GB PCIe")):
        out = tmp_path / scenario
        assert collect(GPU / scenario, out).returncode == 0
        got = samples((out / "nodeforge_gpu.prom").read_text())
        gpus = {k[1] for k in got if k[0] == "DCGM_FI_DEV_GPU_TEMP"}
        assert gpus == {str(i) for i in range(count)}
        assert all(got[("DCGM_FI_DEV_GPU_TEMP", g)][0]["device"] == f"nvidia{g}" for g in gpus)
        assert got[("DCGM_FI_DEV_GPU_TEMP", "0")][0]["modelName"] == model
        assert "nodeforge_gpu_collector_gpus " + str(count) in (out / "nodeforge_gpu_collector.prom").read_text()


def test_unreadable_values_are_left_out_not_written_as_zero(tmp_path: Path) -> None:
    out = tmp_path / "a100"
    assert collect(GPU / "a100-pcie-1gpu", out).returncode == 0
    text = (out / "nodeforge_gpu.prom").read_text()
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in text  # [N/A] on this board
    assert 'DCGM_FI_DEV_GPU_TEMP{gpu="0"' in text
    out = tmp_path / "failing"
    assert collect(GPU / "h100-sxm-8gpu-failing", out).returncode == 0
    got = samples((out / "nodeforge_gpu.prom").read_text())
    # [Unknown Error] on GPU 4
    assert ("DCGM_FI_DEV_POWER_USAGE", "4") not in got and ("DCGM_FI_DEV_MEMORY_TEMP", "4") not in got
    assert ("DCGM_FI_DEV_POWER_USAGE", "3") in got and ("DCGM_FI_DEV_MEMORY_TEMP", "3") in got
    # [Not Supported], as older boards print it
    line = (GPU / "h100-sxm-8gpu/query-gpu-monitoring.csv").read_text().splitlines()[0].split(", ")
    line[5] = line[10] = "[Not Supported]"
    rules = [{"args": "--query-gpu=.*", "stdout": "test-query.csv"}]
    scenario = overlay(tmp_path, "h100-sxm-8gpu", "nvidia-smi", rules, {"test-query.csv": ", ".join(line) + "\n"})
    out = tmp_path / "not-supported"
    assert collect(scenario, out).returncode == 0
    got = samples((out / "nodeforge_gpu.prom").read_text())
    assert ("DCGM_FI_DEV_MEM_COPY_UTIL", "0") not in got and ("DCGM_FI_DEV_MEMORY_TEMP", "0") not in got
    assert got[("DCGM_FI_DEV_GPU_UTIL", "0")][1] == 98


def test_faults_of_the_failing_node_show_in_the_metrics(tmp_path: Path) -> None:
    out = tmp_path / "textfile"
    assert collect(GPU / "h100-sxm-8gpu-failing", out).returncode == 0
    got = samples((out / "nodeforge_gpu.prom").read_text())
    assert got[("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "2")][1] == 18342
    assert got[("DCGM_FI_DEV_PCIE_LINK_GEN", "2")][1] == 4
    assert got[("DCGM_FI_DEV_GPU_TEMP", "5")][1] == 91
    assert got[("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "5")][1] == 0x60
    assert got[("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "6")][1] == 2
    assert got[("DCGM_FI_DEV_ROW_REMAP_PENDING", "6")][1] == 1
    assert got[("DCGM_FI_DEV_ROW_REMAP_PENDING", "0")][1] == 0
    # the kernel log's Xids counted per GPU and code, matched by bus id (d1 is GPU 6, c3 is GPU 5)
    text = (out / "nodeforge_gpu.prom").read_text()
    xids = sorted(line for line in text.splitlines() if line.startswith("nodeforge_gpu_xid_total{"))
    assert xids == [
        'nodeforge_gpu_xid_total{gpu="5",pci_bus_id="00000000:C3:00.0",xid="13",Hostname="node1"} 1',
        'nodeforge_gpu_xid_total{gpu="6",pci_bus_id="00000000:D1:00.0",xid="48",Hostname="node1"} 1',
        'nodeforge_gpu_xid_total{gpu="6",pci_bus_id="00000000:D1:00.0",xid="63",Hostname="node1"} 1',
    ]


def test_a_failing_nvidia_smi_drops_the_previous_values_and_says_up_0(tmp_path: Path) -> None:
    out = tmp_path / "textfile"
    assert collect(GPU / "h100-sxm-8gpu", out).returncode == 0
    before = (out / "nodeforge_gpu.prom").read_bytes()
    message = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n")
    rules = [{"args": ".*", "stdout": "test-no-driver.txt", "exit": 9}]
    broken = overlay(tmp_path, "h100-sxm-8gpu", "nvidia-smi", rules, {"test-no-driver.txt": message})
    proc = collect(broken, out)
    assert proc.returncode == 1
    assert "exited 9: NVIDIA-SMI has failed" in proc.stderr
    after = (out / "nodeforge_gpu.prom").read_text()
    assert before and "DCGM_FI_DEV_" not in after  # never the last good values
    assert "nodeforge_gpu_collector_up 0\n" in (out / "nodeforge_gpu_collector.prom").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["nodeforge_gpu.prom", "nodeforge_gpu_collector.prom"]
    assert collect(GPU / "h100-sxm-8gpu", out).returncode == 0
    assert "nodeforge_gpu_collector_up 1\n" in (out / "nodeforge_gpu_collector.prom").read_text()


def test_an_unreadable_kernel_log_only_drops_the_xid_metric(tmp_path: Path) -> None:
    scenario = overlay(tmp_path, "h100-sxm-8gpu", "journalctl", [{"args": ".*", "stdout": "test-empty.txt", "exit": 1}],
                       {"test-empty.txt": "-- No entries --\n"})
    out = tmp_path / "textfile"
    proc = collect(scenario, out)
    assert proc.returncode == 0 and "no Xid metric" in proc.stderr
    text = (out / "nodeforge_gpu.prom").read_text()
    assert "nodeforge_gpu_xid_total" not in text and "DCGM_FI_DEV_GPU_UTIL" in text


def test_files_are_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = load_program(COLLECTOR)
    out = tmp_path / "textfile"
    out.mkdir()
    old = "# HELP x old\n# TYPE x gauge\nx 1\n"
    (out / "nodeforge_gpu.prom").write_text(old)
    seen: list[tuple[str, dict[str, str]]] = []
    real_replace = os.replace

    def watching_replace(src: Any, dst: Any) -> None:
        # just before the rename: the collector's *.prom files hold complete old content, and the
        # new content sits in a file node exporter does not read (not *.prom), complete already
        visible = {p.name: p.read_text() for p in out.glob("*.prom")}
        seen.append((Path(src).name, visible))
        assert not Path(src).name.endswith(".prom") and Path(src).parent == out
        assert Path(src).read_text().endswith("\n")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", watching_replace)
    env, _ = fake_tools(GPU / "h100-sxm-8gpu", tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    rc = mod.main(["--output-dir", str(out), "--nvidia-smi", fake("nvidia-smi"),
                   "--journalctl", fake("journalctl"), "--hostname", "node1", "--sysfs", str(tmp_path)])
    assert rc == 0
    assert seen[0][1] == {"nodeforge_gpu.prom": old}  # the old file whole until the rename
    assert "DCGM_FI_DEV_GPU_UTIL" in (out / "nodeforge_gpu.prom").read_text()
    assert oct((out / "nodeforge_gpu.prom").stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in out.iterdir()) == ["nodeforge_gpu.prom", "nodeforge_gpu_collector.prom"]


# --- the layer: rendered rules, scrape and DCGM configuration ---------------------------------

SCRATCH_IMAGE = scratch_image("monitoring-scratch", "a node with the gpu-monitoring layer",
                              ["base", "monitoring", "gpu-monitoring"])


@pytest.fixture
def monitoring_tree(tmp_path: Path) -> Path:
    """A small tree of its own: the layers this image needs, the image, an empty config."""
    return tree_with_layers(tmp_path, ("base", "node-lib", "gpu-present", "monitoring", "gpu-monitoring"),
                            {"monitoring-scratch": SCRATCH_IMAGE})


def render(tree: Path, out: Path, *sets: str) -> Path:
    """The gpu-monitoring layer's files as the image gets them."""
    args = [a for s in sets for a in ("--set", s)]
    proc = nodeforge(tree, "render", "monitoring-scratch", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    (root,) = out.glob("*-gpu-monitoring/root")
    return root


RULES = "usr/share/nodeforge/prometheus/gpu-alerts.rules.yml"


def stripped_rules(root: Path, work: Path) -> Path:
    """The rendered rules without annotations: the unit tests assert behaviour, not wording."""
    data = yaml.safe_load((root / RULES).read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = work / "rules-stripped.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


L = 'gpu="0",UUID="GPU-a",modelName="NVIDIA H100 80GB HBM3",Hostname="n1",instance="n1:9100",job="gpu"'
LABELS = {"gpu": "0", "UUID": "GPU-a", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "n1",
          "instance": "n1:9100", "job": "gpu"}
IB = 'device="mlx5_0",port="1",instance="n1:9100",job="node"'
IB_LABELS = {"device": "mlx5_0", "port": "1", "instance": "n1:9100", "job": "node"}
NODE = 'instance="n1:9100",job="gpu"'


def case(series: dict[str, str], alert: str, at: str, fires: bool, severity: str = "warning",
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    expected = [{"exp_labels": {"severity": severity, **(LABELS if labels is None else labels)}}] if fires else []
    return {"interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": expected}]}


def g(name: str) -> str:
    return f"{name}{{{L}}}"


def fb(used: str, free: str) -> dict[str, str]:
    return {g("DCGM_FI_DEV_FB_USED"): used, g("DCGM_FI_DEV_FB_FREE"): free}


def busy(util: str, used: str) -> dict[str, str]:
    return {g("DCGM_FI_DEV_GPU_UTIL"): util, g("DCGM_FI_DEV_FB_USED"): used}


TEXTFILE = "/var/lib/prometheus/node-exporter/nodeforge_gpu.prom"
MTIME = f'node_textfile_mtime_seconds{{file="{TEXTFILE}",{NODE}}}'


def default_cases() -> list[dict[str, Any]]:
    return [
        # utilisation under 30 % for 1 h while a process holds memory: an idle allocation
        case(busy("10x90", "40000x90"), "GpuUtilisationLow", "70m", True),
        case(busy("10x90", "40000x90"), "GpuUtilisationLow", "50m", False),
        case(busy("10x90", "0x90"), "GpuUtilisationLow", "70m", False),
        case(busy("45x90", "40000x90"), "GpuUtilisationLow", "70m", False),
        # framebuffer over 90 % for 5 minutes
        case(fb("74000x10", "6000x10"), "GpuFramebufferHigh", "8m", True, "info"),
        case(fb("74000x10", "6000x10"), "GpuFramebufferHigh", "3m", False),
        case(fb("70000x10", "10000x10"), "GpuFramebufferHigh", "8m", False),
        # PCIe replays: 100 a minute is a bad link, 1 a minute is not
        case({g("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"): "0+100x20"}, "GpuPcieReplays", "15m", True),
        case({g("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"): "0+1x20"}, "GpuPcieReplays", "15m", False),
        # temperatures
        case({g("DCGM_FI_DEV_GPU_TEMP"): "91x10"}, "GpuTemperatureHigh", "8m", True),
        case({g("DCGM_FI_DEV_GPU_TEMP"): "83x10"}, "GpuTemperatureHigh", "8m", False),
        case({g("DCGM_FI_DEV_MEMORY_TEMP"): "97x10"}, "GpuMemoryTemperatureHigh", "8m", True),
        case({g("DCGM_FI_DEV_MEMORY_TEMP"): "80x10"}, "GpuMemoryTemperatureHigh", "8m", False),
        # clock event reasons: thermal (0x60), HW slowdown (0x8) and HW power brake (0x80) fire, idle (0x1),
        # power cap (0x4) and sync boost (0x10) do not
        case({g("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"): "96x10"}, "GpuClocksSlowedDown", "8m", True),
        case({g("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"): "8x10"}, "GpuClocksSlowedDown", "8m", True),
        case({g("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"): "128x10"}, "GpuClocksSlowedDown", "8m", True),
        case({g("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"): "1x10"}, "GpuClocksSlowedDown", "8m", False),
        case({g("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"): "4x10"}, "GpuClocksSlowedDown", "8m", False),
        case({g("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"): "21x10"}, "GpuClocksSlowedDown", "8m", False),
        # ECC and row remapping: a count present at the first scrape alerts (a level, not an increase)
        case({g("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"): "2x5"}, "GpuEccUncorrectable", "0m", True, "critical"),
        case({g("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"): "0x5"}, "GpuEccUncorrectable", "2m", False),
        case({g("DCGM_FI_DEV_ROW_REMAP_PENDING"): "1x5"}, "GpuRowRemapPending", "1m", True),
        case({g("DCGM_FI_DEV_ROW_REMAP_PENDING"): "0x5"}, "GpuRowRemapPending", "1m", False),
        case({g("DCGM_FI_DEV_ROW_REMAP_FAILURE"): "1x5"}, "GpuRowRemapFailure", "1m", True, "critical"),
        case({g("DCGM_FI_DEV_ROW_REMAP_FAILURE"): "0x5"}, "GpuRowRemapFailure", "1m", False),
        # InfiniBand: any receive error or link-downed increment in the window
        case({f"node_infiniband_port_errors_received_total{{{IB}}}": "0 0 0 5 5 5"}, "InfinibandReceiveErrors", "5m",
             True, labels=IB_LABELS),
        case({f"node_infiniband_port_errors_received_total{{{IB}}}": "7x5"}, "InfinibandReceiveErrors", "5m", False),
        case({f"node_infiniband_link_downed_total{{{IB}}}": "0 0 1 1 1"}, "InfinibandLinkDowned", "4m", True,
             "critical", IB_LABELS),
        case({f"node_infiniband_link_downed_total{{{IB}}}": "3x5"}, "InfinibandLinkDowned", "4m", False),
        # the collector itself: failing for 90 s (3 intervals), or its file not rewritten for 150 s
        case({f"nodeforge_gpu_collector_up{{{NODE}}}": "0x5"}, "GpuCollectorDown", "3m", True,
             labels={"instance": "n1:9100", "job": "gpu"}),
        case({f"nodeforge_gpu_collector_up{{{NODE}}}": "1x5"}, "GpuCollectorDown", "3m", False),
        case({MTIME: "0x10"},
             "GpuMetricsStale", "5m", True,
             labels={"file": TEXTFILE, "instance": "n1:9100", "job": "gpu"}),
        case({MTIME: "0+60x10"},
             "GpuMetricsStale", "5m", False),
        # a lost GPU: the driver sees 7 of the 8 on the PCI bus, or nvidia-smi fails
        case({f"nodeforge_gpu_collector_gpus{{{NODE}}}": "7x5", f"nodeforge_gpu_pci_gpus{{{NODE}}}": "8x5",
              f"nodeforge_gpu_collector_up{{{NODE}}}": "1x5"}, "GpuMissing", "3m", True, "critical",
             {"instance": "n1:9100", "job": "gpu"}),
        case({f"nodeforge_gpu_collector_gpus{{{NODE}}}": "8x5", f"nodeforge_gpu_pci_gpus{{{NODE}}}": "8x5",
              f"nodeforge_gpu_collector_up{{{NODE}}}": "1x5"}, "GpuMissing", "3m", False),
    ]


def run_rule_tests(rules: Path, tests: list[dict[str, Any]], work: Path) -> subprocess.CompletedProcess[str]:
    spec = work / "rule-tests.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}))
    return promtool("test", "rules", str(spec))


@needs_promtool
def test_rendered_rules_pass_promtool_check_rules(monitoring_tree: Path, tmp_path: Path) -> None:
    for n, sets in enumerate(([], ["gpu-monitoring.expected_gpus=8", "gpu-monitoring.temp_gpu_celsius=80"])):
        root = render(monitoring_tree, tmp_path / f"render{n}", *sets)
        check = promtool("check", "rules", str(root / RULES))
        assert check.returncode == 0, check.stdout + check.stderr
        assert "SUCCESS: 14 rules found" in check.stdout  # the Xid rules are generated into their own file


@needs_promtool
def test_every_alert_fires_and_stays_quiet_as_it_should(monitoring_tree: Path, tmp_path: Path) -> None:
    root = render(monitoring_tree, tmp_path / "render")
    rules = stripped_rules(root, tmp_path)
    tests = default_cases()
    alerts = {r["alert"] for g in yaml.safe_load((root / RULES).read_text())["groups"] for r in g["rules"]}
    assert alerts == {t["alert_rule_test"][0]["alertname"] for t in tests}  # no rule escapes the tests
    for t in tests:  # each has a firing and a quiet case
        assert any(u["alert_rule_test"][0]["alertname"] == t["alert_rule_test"][0]["alertname"]
                   and bool(u["alert_rule_test"][0]["exp_alerts"]) != bool(t["alert_rule_test"][0]["exp_alerts"])
                   for u in tests)
    proc = run_rule_tests(rules, tests, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # and the tests can fail: the same cases against rules with another threshold
    wrong = render(monitoring_tree, tmp_path / "render-wrong", "gpu-monitoring.temp_gpu_celsius=95")
    proc = run_rule_tests(stripped_rules(wrong, tmp_path), tests, tmp_path)
    assert proc.returncode != 0 and "GpuTemperatureHigh" in proc.stdout + proc.stderr


@needs_promtool
def test_changed_thresholds_change_what_fires(monitoring_tree: Path, tmp_path: Path) -> None:
    root = render(monitoring_tree, tmp_path / "render", "gpu-monitoring.fb_high_pct=95",
                  "gpu-monitoring.temp_gpu_celsius=80", "gpu-monitoring.util_low_pct=50",
                  "gpu-monitoring.util_low_for=10m", "gpu-monitoring.expected_gpus=8")
    tests = [
        case(fb("74000x10", "6000x10"), "GpuFramebufferHigh", "8m", False),
        case(fb("78000x10", "2000x10"), "GpuFramebufferHigh", "8m", True, "info"),
        case({g("DCGM_FI_DEV_GPU_TEMP"): "83x10"}, "GpuTemperatureHigh", "8m", True),
        case(busy("45x20", "40000x20"), "GpuUtilisationLow", "15m", True),
        # expected_gpus: 7 of 8 pages even where the lost GPU left the PCI bus too
        case({f"nodeforge_gpu_collector_gpus{{{NODE}}}": "7x5", f"nodeforge_gpu_pci_gpus{{{NODE}}}": "7x5",
              f"nodeforge_gpu_collector_up{{{NODE}}}": "1x5"},
             "GpuMissing", "3m", True, "critical", {"instance": "n1:9100", "job": "gpu"}),
        case({f"nodeforge_gpu_collector_gpus{{{NODE}}}": "8x5", f"nodeforge_gpu_pci_gpus{{{NODE}}}": "8x5",
              f"nodeforge_gpu_collector_up{{{NODE}}}": "1x5"},
             "GpuMissing", "3m", False),
    ]
    proc = run_rule_tests(stripped_rules(root, tmp_path), tests, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
@pytest.mark.parametrize(("scenario", "expected"), [
    ("h100-sxm-8gpu", set()),
    ("h200-sxm-8gpu", set()),
    ("a100-pcie-1gpu", set()),
    ("h100-sxm-8gpu-failing", {("GpuTemperatureHigh", "5"), ("GpuMemoryTemperatureHigh", "5"),
                               ("GpuClocksSlowedDown", "5"), ("GpuEccUncorrectable", "6"),
                               ("GpuRowRemapPending", "6")}),
])
def test_alerts_on_the_collector_s_own_output(scenario: str, expected: set[tuple[str, str]],
                                              monitoring_tree: Path, tmp_path: Path) -> None:
    """The rules read exactly what the collector writes: its output held for 10 minutes."""
    out = tmp_path / "textfile"
    assert collect(GPU / scenario, out).returncode == 0
    series = {}
    for line in (out / "nodeforge_gpu.prom").read_text().splitlines():
        m = SAMPLE.match(line)
        if m:
            series[f'{m["name"]}{{{m["labels"]},instance="node1:9100",job="gpu"}}'] = f'{m["value"]}x10'
    root = render(monitoring_tree, tmp_path / "render")
    alerts = sorted({r["alert"] for g in yaml.safe_load((root / RULES).read_text())["groups"] for r in g["rules"]})
    firing = []
    for alert in alerts:
        probe = {"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series.items()],
                 "alert_rule_test": [{"eval_time": "10m", "alertname": alert, "exp_alerts": []}]}
        proc = run_rule_tests(stripped_rules(root, tmp_path), [probe], tmp_path)
        if proc.returncode != 0:
            firing += [(alert, gpu) for gpu in re.findall(r'gpu="(\d+)"', proc.stdout + proc.stderr)]
    assert set(firing) == expected


@needs_promtool
def test_scrape_configuration_is_valid_and_targets_both_exporters(monitoring_tree: Path, tmp_path: Path) -> None:
    root = render(monitoring_tree, tmp_path / "render", "gpu-monitoring.dcgm_exporter=true", "monitoring.port=9101")
    prom = root / "usr/share/nodeforge/prometheus"
    # the Xid rules are made by a build step in the image: here by the same program, from the source tree
    xid = subprocess.run([sys.executable, str(ROOT / "layers/node-lib/files/nodeforge-xid-rules"),
                          "--policy", str(ROOT / "layers/node-lib/files/xid-policy.tsv")],
                         capture_output=True, text=True, env=program_env(), timeout=60)
    assert xid.returncode == 0, xid.stderr
    (prom / "gpu-xid.rules.yml").write_text(xid.stdout)
    check = promtool("check", "config", "prometheus-gpu-nodes.yml", cwd=prom)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 2 rule files found" in check.stdout
    config = yaml.safe_load((prom / "prometheus-gpu-nodes.yml").read_text())
    jobs = {j["job_name"]: j["relabel_configs"][0]["replacement"] for j in config["scrape_configs"]}
    assert jobs == {"gpu-node-exporter": "${1}:9101", "dcgm-exporter": "${1}:9400"}
    off = render(monitoring_tree, tmp_path / "render-off")
    config = yaml.safe_load((off / "usr/share/nodeforge/prometheus/prometheus-gpu-nodes.yml").read_text())
    assert [j["job_name"] for j in config["scrape_configs"]] == ["gpu-node-exporter"]


def test_dcgm_counters_file_has_dcgm_exporter_s_format_and_every_metric_the_rules_need(
        monitoring_tree: Path, tmp_path: Path) -> None:
    root = render(monitoring_tree, tmp_path / "render", "gpu-monitoring.dcgm_exporter=true",
                  "gpu-monitoring.dcgm_exporter_port=9500")
    names = set()
    for line in (root / "etc/dcgm-exporter/default-counters.csv").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        assert len(fields) == 3, line  # dcgm-exporter: "expected 3 fields"
        assert fields[1] in ("gauge", "counter", "histogram", "summary", "label"), line
        assert re.fullmatch(r"DCGM_FI_[A-Z0-9_]+", fields[0]), line
        names.add(fields[0])
    used = set(re.findall(r"DCGM_FI_[A-Z0-9_]+", (root / RULES).read_text()))
    assert used and used <= names, used - names
    assert set(f.metric for f in load_program(COLLECTOR).FIELDS) <= names
    settings = (root / "etc/default/dcgm-exporter").read_text()
    assert 'DCGM_EXPORTER_LISTEN=":9500"' in settings
    unit = (root / "etc/systemd/system/nodeforge-dcgm-exporter.service").read_text()
    assert "ConditionPathExists=/usr/bin/dcgm-exporter" in unit and "EnvironmentFile=/etc/default/dcgm-exporter" in unit
    assert "ExecCondition=/usr/lib/nodeforge/nvidia-gpu-present" in unit


def test_collector_unit_writes_where_node_exporter_reads(monitoring_tree: Path, tmp_path: Path) -> None:
    root = render(monitoring_tree, tmp_path / "render", "monitoring.textfile_dir=/srv/textfile",
                  "gpu-monitoring.interval_s=60", "gpu-monitoring.xid_from_kernel_log=false")
    unit = (root / "etc/systemd/system/nodeforge-gpu-metrics.service").read_text()
    assert ("ExecStart=/usr/local/sbin/nodeforge-gpu-metrics --output-dir /srv/textfile "
            "--nvidia-smi /usr/bin/nvidia-smi --no-xid\n") in unit
    assert "ExecCondition=/usr/lib/nodeforge/nvidia-gpu-present" in unit and "/dev/nvidiactl" not in unit
    assert "OnUnitActiveSec=60s" in (root / "etc/systemd/system/nodeforge-gpu-metrics.timer").read_text()


@pytest.mark.parametrize(("setting", "expected"), [
    ("gpu-monitoring.fb_high_pct=150", "expected a value <= 100, found 150"),
    ("gpu-monitoring.temp_gpu_celsius=500", "expected a value <= 120, found 500"),
    ("gpu-monitoring.util_low_pct=0", "expected a value >= 1, found 0"),
    ("gpu-monitoring.util_low_for=forever", "gpu-monitoring.util_low_for"),
    ("gpu-monitoring.xid_window=forever", "gpu-monitoring.xid_window"),
    ("gpu-monitoring.temp_memory_celsius=-1", "expected a value >= 0, found -1"),
    ("gpu-monitoring.dcgm_exporter_port=9100", "dcgm_exporter_port 9100 is node exporter's port 9100"),
])
def test_a_wrong_threshold_is_rejected_by_the_typed_parameters(monitoring_tree: Path, setting: str,
                                                              expected: str) -> None:
    proc = nodeforge(monitoring_tree, "plan", "monitoring-scratch", "--set", setting)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert nodeforge(monitoring_tree, "plan", "monitoring-scratch").returncode == 0
