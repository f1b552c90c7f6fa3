"""gpu-monitoring: a lost GPU pages, Xids are counted, limits per model (review M1, M2, M4, M5, M6, M7).

The collector runs on recorded nvidia-smi output and a recorded PCI bus (fake tools, sysfs
fixtures under tests/fixtures/gpu/monitoring-*), and what it writes is fed, as it is, to the
rendered alert rules under Debian's promtool (`promtool test rules`). The Xid rules are the ones
the layer's build step generates (nodeforge-xid-rules, node-lib) from the node's Xid policy.
"""

from __future__ import annotations

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
from support.trees import nodeforge, scratch_image, tree_with_layers

ROOT = Path(__file__).resolve().parent.parent
COLLECTOR = ROOT / "layers/gpu-monitoring/files/nodeforge-gpu-metrics"
XID_RULES = ROOT / "layers/node-lib/files/nodeforge-xid-rules"
XID_POLICY = ROOT / "layers/node-lib/files/xid-policy.tsv"
GPU = ROOT / "tests/fixtures/gpu"
HGX_BUS = GPU / "monitoring-sysfs-hgx-h100"
V100 = GPU / "monitoring-v100-sxm2-4gpu"
RULES = "usr/share/nodeforge/prometheus/gpu-alerts.rules.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")
SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$')
INSTANCE = 'instance="node1:9100",job="gpu"'


def collect(scenario: Path, out: Path, sysfs: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    out.mkdir(parents=True, exist_ok=True)
    env, _ = fake_tools(scenario, out.parent, base={"PATH": "/usr/bin:/bin"})
    return subprocess.run([sys.executable, str(COLLECTOR), "--output-dir", str(out), "--hostname", "node1",
                           "--nvidia-smi", fake("nvidia-smi"), "--journalctl", fake("journalctl"),
                           "--sysfs", str(sysfs), *extra], capture_output=True, text=True, env=env, timeout=120)


def series_of(out: Path) -> dict[str, str]:
    """{series with the scrape's labels: value} of every sample the collector's two files hold."""
    result = {}
    for name in ("nodeforge_gpu.prom", "nodeforge_gpu_collector.prom"):
        for line in (out / name).read_text().splitlines():
            m = SAMPLE.match(line)
            if m:
                labels = f'{m["labels"]},{INSTANCE}' if m["labels"] else INSTANCE
                result[f'{m["name"]}{{{labels}}}'] = m["value"]
    return result


def held(series: dict[str, str], minutes: int = 15) -> list[dict[str, str]]:
    return [{"series": s, "values": f"{v}x{minutes}"} for s, v in series.items()]


def promtool_test(rule_files: list[Path], tests: list[dict[str, Any]], work: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    spec = work / "rule-tests.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(r) for r in rule_files], "evaluation_interval": "1m",
                                    "tests": tests}))
    return subprocess.run([PROMTOOL, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)


def stripped(rules: Path, work: Path, name: str = "rules-stripped.yml") -> Path:
    data = yaml.safe_load(rules.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = work / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def firing(rule_files: list[Path], inputs: list[dict[str, str]], alerts: list[str], at: str,
           work: Path) -> set[tuple[str, str, str]]:
    """(alert, gpu, severity) of what fires at `at`: each alert probed with 'nothing fires' and the
    difference promtool reports read back."""
    found = set()
    for alert in alerts:
        probe = {"interval": "1m", "input_series": inputs,
                 "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": []}]}
        proc = promtool_test(rule_files, [probe], work)
        text = proc.stdout + proc.stderr
        if proc.returncode != 0:
            assert "got:" in text, text
            got = text.split("got:", 1)[1]
            for labels in re.findall(r"Labels:\{([^}]*)\}", got):
                gpu = re.search(r'gpu="([^"]*)"', labels)
                severity = re.search(r'severity="([^"]*)"', labels)
                found.add((alert, gpu.group(1) if gpu else "", severity.group(1) if severity else ""))
    return found


V100_CONFIG = ("name: v100\nsummary: V100 nodes\nsite:\n"
               "  gpu: {model: Tesla V100-SXM2-32GB, count: 4, memory-mib: 32768}\n")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    image = scratch_image("monitoring-scratch", "a node with the gpu-monitoring layer",
                          ["base", "monitoring", "gpu-monitoring"])
    return tree_with_layers(tmp_path, ("base", "node-lib", "gpu-present", "monitoring", "gpu-monitoring"),
                            {"monitoring-scratch": image},
                            {"default": "name: default\nsummary: defaults\n", "v100": V100_CONFIG})


def render(tree: Path, out: Path, *args: str) -> Path:
    proc = nodeforge(tree, "render", "monitoring-scratch", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    (root,) = out.glob("*-gpu-monitoring/root")
    return root


def alerts_of(rules: Path) -> list[str]:
    return sorted({r["alert"] for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]})


def xid_rules(work: Path) -> Path:
    """The Xid rules as the layer's build step makes them (nodeforge-xid-rules on the policy table)."""
    proc = subprocess.run([sys.executable, str(XID_RULES), "--policy", str(XID_POLICY), "--window", "10m"],
                          capture_output=True, text=True, env=program_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    path = work / "gpu-xid.rules.yml"
    path.write_text(proc.stdout)
    return stripped(path, work, "xid-stripped.yml")


# --- M5: the PCI bus against the driver; a failing nvidia-smi serves no stale values ----------------

def test_m5_collector_counts_the_gpus_on_the_pci_bus(tmp_path: Path) -> None:
    out = tmp_path / "textfile"
    assert collect(GPU / "h100-sxm-8gpu", out, HGX_BUS).returncode == 0
    status = (out / "nodeforge_gpu_collector.prom").read_text()
    # eight 3D controllers of vendor 0x10de; not the NVSwitches (bridges), the NIC or the BMC's ASPEED VGA
    assert "nodeforge_gpu_pci_gpus 8\n" in status and "nodeforge_gpu_collector_gpus 8\n" in status
    assert "nodeforge_gpu_collector_up 1\n" in status
    out = tmp_path / "v100"
    assert collect(V100, out, V100 / "sysfs").returncode == 0
    assert "nodeforge_gpu_pci_gpus 4\n" in (out / "nodeforge_gpu_collector.prom").read_text()  # not the Matrox VGA
    empty = tmp_path / "no-bus"
    empty.mkdir()
    out = tmp_path / "nobus"
    assert collect(GPU / "h100-sxm-8gpu", out, empty).returncode == 0
    assert "nodeforge_gpu_pci_gpus 0\n" in (out / "nodeforge_gpu_collector.prom").read_text()


def test_m5_a_gpu_fallen_off_the_bus_drops_every_nvidia_smi_series(tmp_path: Path) -> None:
    out = tmp_path / "textfile"
    assert collect(GPU / "h100-sxm-8gpu", out, HGX_BUS).returncode == 0
    assert "DCGM_FI_DEV_GPU_UTIL{" in (out / "nodeforge_gpu.prom").read_text()
    proc = collect(GPU / "monitoring-gpu-lost", out, HGX_BUS)
    assert proc.returncode == 1
    assert "exited 15: Unable to determine the device handle for GPU0000:9D:00.0: Unknown Error" in proc.stderr
    metrics = (out / "nodeforge_gpu.prom").read_text()
    assert "DCGM_FI_DEV" not in metrics, "the last good values of eight GPUs must not be served"
    status = (out / "nodeforge_gpu_collector.prom").read_text()
    assert "nodeforge_gpu_collector_up 0\n" in status and "nodeforge_gpu_collector_gpus 0\n" in status
    assert "nodeforge_gpu_pci_gpus 8\n" in status
    # the kernel log does not depend on nvidia-smi: Xid 79 counted for GPU 4 (its place in PCI order)
    assert ('nodeforge_gpu_xid_total{gpu="4",pci_bus_id="00000000:9D:00.0",xid="79",Hostname="node1"} 1'
            in metrics.splitlines())
    assert sorted(p.name for p in out.iterdir()) == ["nodeforge_gpu.prom", "nodeforge_gpu_collector.prom"]


def test_m5_a_failing_nvidia_smi_without_a_kernel_log_leaves_an_empty_metrics_file(tmp_path: Path) -> None:
    out = tmp_path / "textfile"
    assert collect(GPU / "monitoring-gpu-lost", out, HGX_BUS, "--no-xid").returncode == 1
    text = (out / "nodeforge_gpu.prom").read_text()
    assert all(line.startswith("#") for line in text.splitlines()) and "exited 15" in text


@needs_promtool
@pytest.mark.parametrize(("scenario", "expected"), [
    ("h100-sxm-8gpu", set()),
    ("monitoring-gpu-lost", {("GpuMissing", "", "critical"), ("GpuCollectorDown", "", "warning")}),
    ("monitoring-gpu-7of8", {("GpuMissing", "", "critical")}),
])
def test_m5_gpu_missing_pages_on_what_the_collector_writes(scenario: str, expected: set[tuple[str, str, str]],
                                                          tree: Path, tmp_path: Path) -> None:
    """No expected_gpus set: the PCI bus alone says how many GPUs the driver must see."""
    out = tmp_path / "textfile"
    collect(GPU / scenario, out, HGX_BUS)
    root = render(tree, tmp_path / "render")
    rules = stripped(root / RULES, tmp_path)
    got = firing([rules], held(series_of(out)), alerts_of(rules), "10m", tmp_path)
    assert got == expected


@needs_promtool
def test_m5_gpu_missing_rule_fires_and_stays_quiet_as_it_should(tree: Path, tmp_path: Path) -> None:
    rules = stripped(render(tree, tmp_path / "render") / RULES, tmp_path)

    def node(up: int, gpus: int, pci: int) -> list[dict[str, str]]:
        return held({f"nodeforge_gpu_collector_up{{{INSTANCE}}}": str(up),
                     f"nodeforge_gpu_collector_gpus{{{INSTANCE}}}": str(gpus),
                     f"nodeforge_gpu_pci_gpus{{{INSTANCE}}}": str(pci)})

    for (up, gpus, pci), fires in (((0, 0, 8), True), ((1, 7, 8), True), ((1, 8, 8), False), ((1, 1, 1), False),
                                   ((1, 0, 0), False)):
        got = firing([rules], node(up, gpus, pci), ["GpuMissing"], "5m", tmp_path)
        assert got == ({("GpuMissing", "", "critical")} if fires else set()), (up, gpus, pci)
    # for three collection intervals: one failed run does not page
    blip = held({f"nodeforge_gpu_collector_up{{{INSTANCE}}}": "0",
                 f"nodeforge_gpu_collector_gpus{{{INSTANCE}}}": "0", f"nodeforge_gpu_pci_gpus{{{INSTANCE}}}": "8"}, 1)
    assert firing([rules], blip, ["GpuMissing"], "0m", tmp_path) == set()


# --- M4: per-Xid counters; the old last-Xid alerts are gone ----------------------------------------

def test_m4_xids_are_counted_per_gpu_and_code_since_boot(tmp_path: Path) -> None:
    log = (GPU / "h100-sxm-8gpu-failing/monitoring-kernel-log.txt").read_text()
    log += ("NVRM: Xid (PCI:0000:c3:00): 13, pid=48290, name=python3, Graphics SM Warp Exception on (GPC 2)\n"
            "NVRM: Xid (PCI:0000:c3:00): 13, pid=48291, name=python3, Graphics Exception: ESR 0x51e730=0x0\n")
    scenario = overlay_scenario(tmp_path, GPU / "h100-sxm-8gpu-failing", "journalctl",
                                [{"args": ".*", "stdout": "test-log.txt"}], {"test-log.txt": log})
    out = tmp_path / "textfile"
    assert collect(scenario, out, HGX_BUS).returncode == 0
    text = (out / "nodeforge_gpu.prom").read_text()
    assert "# TYPE nodeforge_gpu_xid_total counter" in text
    got = {(m["gpu"], m["xid"]): int(m["n"]) for m in re.finditer(
        r'^nodeforge_gpu_xid_total\{gpu="(?P<gpu>\d*)",pci_bus_id="[^"]+",xid="(?P<xid>\d+)",Hostname="node1"\} '
        r"(?P<n>\d+)$", text, re.M)}
    assert got == {("5", "13"): 3, ("6", "48"): 1, ("6", "63"): 1}
    assert "DCGM_FI_DEV_XID_ERRORS" not in text


def test_m4_the_last_xid_alerts_are_gone_and_the_build_generates_the_xid_rules(tree: Path, tmp_path: Path) -> None:
    root = render(tree, tmp_path / "render")
    rules = (root / RULES).read_text()
    assert "DCGM_FI_DEV_XID_ERRORS" not in rules and "GpuXid" not in rules
    proc = nodeforge(tree, "plan", "monitoring-scratch", "--json", "--set", "gpu-monitoring.xid_window=15m")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"/usr/lib/nodeforge/nodeforge-xid-rules --window 15m\s.*> "
                     r"/usr/share/nodeforge/prometheus/gpu-xid\.rules\.yml", proc.stdout)
    scrape = (root / "usr/share/nodeforge/prometheus/prometheus-gpu-nodes.yml").read_text()
    assert yaml.safe_load(scrape)["rule_files"] == ["gpu-alerts.rules.yml", "gpu-xid.rules.yml"]


@needs_promtool
def test_m4_a_critical_xid_stays_firing_when_an_application_xid_follows(tmp_path: Path) -> None:
    """The collector's counters, before and after an Xid 13 on the GPU that logged Xid 48: the old
    last-Xid gauge went from 48 to 13 and resolved the page."""
    base = (GPU / "h100-sxm-8gpu/monitoring-kernel-log.txt").read_text()
    first = base + "NVRM: Xid (PCI:0000:d1:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE\n"
    second = first + "NVRM: Xid (PCI:0000:d1:00): 13, pid=4711, name=python3, Graphics SM Warp Exception\n"
    outputs = []
    for n, log in enumerate((base, first, second)):
        scenario = overlay_scenario(tmp_path / f"s{n}", GPU / "h100-sxm-8gpu", "journalctl",
                                    [{"args": ".*", "stdout": "test-log.txt"}], {"test-log.txt": log})
        out = tmp_path / f"out{n}"
        assert collect(scenario, out, HGX_BUS).returncode == 0
        outputs.append(series_of(out))
    names = sorted({s for o in outputs for s in o if s.startswith("nodeforge_gpu_xid_total")})
    # minutes 0-4 no Xid, 5-9 the Xid 48, 10-20 the Xid 13 too
    inputs = [{"series": s, "values": " ".join([outputs[0].get(s, "_")] * 5 + [outputs[1].get(s, "_")] * 5
                                               + [outputs[2].get(s, "_")] * 11)} for s in names]
    rules = xid_rules(tmp_path)
    critical = ("GpuXidCritical", "6", "critical")
    assert critical not in firing([rules], inputs, ["GpuXidCritical"], "4m", tmp_path)
    assert critical in firing([rules], inputs, ["GpuXidCritical"], "6m", tmp_path)
    assert critical in firing([rules], inputs, ["GpuXidCritical"], "11m", tmp_path)  # after the Xid 13
    assert ("GpuXidCritical", "6", "critical") not in firing([rules], inputs, ["GpuXidCritical"], "20m", tmp_path)
    assert not {a for a in firing([rules], inputs, ["GpuXidWarning"], "11m", tmp_path)}  # 13: an application's


# --- M6: temperature limits per model -----------------------------------------------------------

@needs_promtool
@pytest.mark.parametrize(("config", "sets", "expected"), [
    # V100 from the model table (83/85 C): GPU 3 at 84 C is over its operating limit
    ("v100", [], {("GpuTemperatureHigh", "3"), ("GpuClocksSlowedDown", "3")}),
    # no model known: each GPU's own "Max Operating Temp" as the collector reads it from nvidia-smi -q
    ("default", [], {("GpuTemperatureHigh", "3"), ("GpuClocksSlowedDown", "3")}),
    # a site's own thresholds win
    ("v100", ["gpu-monitoring.temp_gpu_celsius=85"], {("GpuClocksSlowedDown", "3")}),
    ("v100", ["gpu-monitoring.temp_memory_celsius=80"], {("GpuTemperatureHigh", "3"), ("GpuClocksSlowedDown", "3"),
                                                         ("GpuMemoryTemperatureHigh", "3")}),
])
def test_m6_v100_temperature_alerts_at_the_v100_s_own_limits(config: str, sets: list[str],
                                                             expected: set[tuple[str, str]],
                                                             tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "textfile"
    assert collect(V100, out, V100 / "sysfs").returncode == 0
    args = ["-c", config, *(a for s in sets for a in ("--set", s))]
    rules = stripped(render(tree, tmp_path / "render", *args) / RULES, tmp_path)
    alerts = ["GpuTemperatureHigh", "GpuMemoryTemperatureHigh", "GpuClocksSlowedDown", "GpuEccUncorrectable"]
    got = {(a, g) for a, g, _ in firing([rules], held(series_of(out)), alerts, "10m", tmp_path)}
    assert got == expected


def test_m6_the_temperature_parameters_exist_for_configs(tree: Path, tmp_path: Path) -> None:
    for name in ("temp_gpu_celsius", "temp_memory_celsius"):
        proc = nodeforge(tree, "plan", "monitoring-scratch", "--set", f"gpu-monitoring.{name}=80")
        assert proc.returncode == 0, proc.stderr
    rules = (render(tree, tmp_path / "r", "-c", "v100") / RULES).read_text()
    assert "DCGM_FI_DEV_GPU_TEMP >= 83" in rules and "DCGM_FI_DEV_MEMORY_TEMP >= 85" in rules


# --- M7: no page for a full framebuffer, power brake, retired pages -----------------------------------

@needs_promtool
def test_m7_framebuffer_is_info_and_power_brake_slows_clocks(tree: Path, tmp_path: Path) -> None:
    rules = stripped(render(tree, tmp_path / "render") / RULES, tmp_path)
    labels = 'gpu="0",UUID="GPU-a",Hostname="n1",instance="n1:9100",job="gpu"'
    fb = held({f"DCGM_FI_DEV_FB_USED{{{labels}}}": "79000", f"DCGM_FI_DEV_FB_FREE{{{labels}}}": "1000"})
    assert firing([rules], fb, ["GpuFramebufferHigh"], "10m", tmp_path) == {("GpuFramebufferHigh", "0", "info")}
    brake = held({f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{labels}}}": str(0x80)})
    assert firing([rules], brake, ["GpuClocksSlowedDown"], "10m", tmp_path) == {("GpuClocksSlowedDown", "0", "warning")}
    cap = held({f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{labels}}}": str(0x04 | 0x01)})
    assert firing([rules], cap, ["GpuClocksSlowedDown"], "10m", tmp_path) == set()


def test_m7_retired_pages_on_v100_and_none_where_the_gpu_says_n_a(tmp_path: Path) -> None:
    out = tmp_path / "v100"
    assert collect(V100, out, V100 / "sysfs").returncode == 0
    text = (out / "nodeforge_gpu.prom").read_text()
    got = {(m[0], m[1]): m[2] for m in re.findall(r'^(DCGM_FI_DEV_RETIRED_\w+)\{gpu="(\d)"[^}]*\} (\S+)$', text, re.M)}
    assert got[("DCGM_FI_DEV_RETIRED_SBE", "2")] == "2" and got[("DCGM_FI_DEV_RETIRED_DBE", "2")] == "1"
    assert got[("DCGM_FI_DEV_RETIRED_PENDING", "2")] == "1" and got[("DCGM_FI_DEV_RETIRED_PENDING", "0")] == "0"
    assert "# TYPE DCGM_FI_DEV_RETIRED_SBE counter" in text
    assert "DCGM_FI_DEV_ROW_REMAP" not in text  # [N/A] on Volta
    out = tmp_path / "h100"
    assert collect(GPU / "h100-sxm-8gpu", out, HGX_BUS).returncode == 0
    assert "DCGM_FI_DEV_RETIRED" not in (out / "nodeforge_gpu.prom").read_text()  # [N/A] on H100


# --- M1, M2: dcgm-exporter uses the node's host engine, with NVIDIA's default counters --------------

def test_m1_dcgm_exporter_talks_to_the_node_s_host_engine(tree: Path, tmp_path: Path) -> None:
    root = render(tree, tmp_path / "render", "--set", "gpu-monitoring.dcgm_exporter=true")
    settings = (root / "etc/default/dcgm-exporter").read_text()
    assert re.search(r'^DCGM_REMOTE_HOSTENGINE_INFO="localhost:5555"$', settings, re.M), settings
    unit = (root / "etc/systemd/system/nodeforge-dcgm-exporter.service").read_text()
    assert "EnvironmentFile=/etc/default/dcgm-exporter" in unit and "Wants=nvidia-dcgm.service" in unit


def test_m2_default_counters_carry_nvidia_s_profiling_and_nvlink_fields(tree: Path, tmp_path: Path) -> None:
    root = render(tree, tmp_path / "render")
    names = {line.split(",")[0].strip() for line in (root / "etc/dcgm-exporter/default-counters.csv").read_text()
             .splitlines() if line.strip() and not line.startswith("#")}
    assert {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
            "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_PROF_NVLINK_TX_BYTES",
            "DCGM_FI_PROF_NVLINK_RX_BYTES", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"} <= names
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in names
