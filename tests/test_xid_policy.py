"""One Xid policy (gpu-review M3, M4): node-lib's table drives both nodeforge-gpu-health and the Xid alerts.

nodeforge-xid-rules (layers/node-lib) prints the Prometheus rules generated from the table; promtool
(Debian's prometheus package) evaluates them on per-Xid counter series (nodeforge_gpu_xid_total{gpu, xid}).
The health check is run on a recorded healthy H100 node with a kernel log holding every code, and the
alerts it implies are what promtool must find firing: a test fails whenever the two disagree."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.fake_tools import FAKES, fake_tools, merge, program_env

ROOT = Path(__file__).resolve().parent.parent
NODE_LIB = ROOT / "layers/node-lib/files"
RULES_PROGRAM = NODE_LIB / "nodeforge-xid-rules"
POLICY = NODE_LIB / "xid-policy.tsv"
HEALTH = ROOT / "layers/gpu-health/files/gpu-health.py"
GPU = ROOT / "tests/fixtures/gpu"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")
NODE = {"instance": "n1:9100", "job": "gpu"}

# the Xid codes gpu-monitoring's hand-written alerts paged on before (its xid_critical default, the Azure
# HPC node health check's list), read on the "last Xid" gauge DCGM_FI_DEV_XID_ERRORS
OLD_XID_CRITICAL = [48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120]


def xid_rules(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(RULES_PROGRAM), "--policy", str(POLICY), *args], capture_output=True,
                          text=True, env=program_env(), check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def policy_rows() -> dict[int, str]:
    rows = {}
    for line in POLICY.read_text().splitlines():
        if line and not line.startswith("#"):
            code, action, _ = line.split("\t", 2)
            rows[int(code)] = action
    return rows


def paging_codes(rules_text: str, severity: str) -> set[int]:
    """The table codes an alert of `severity` selects (xid=~"a|b|c" selectors)."""
    codes: set[int] = set()
    for group in yaml.safe_load(rules_text)["groups"]:
        for rule in group["rules"]:
            if rule["labels"]["severity"] == severity:
                for sel in re.findall(r'xid=~"([0-9|]+)"', rule["expr"]):
                    codes |= {int(c) for c in sel.split("|")}
    return codes


def disagreements(critical: set[int], warning: set[int], rows: dict[int, str]) -> list[str]:
    """Where alerts paging on `critical` and warning on `warning` contradict the policy table."""
    found = []
    for code, action in sorted(rows.items()):
        want = {"drain": "critical", "reset": "critical", "warn": "warning", "ignore": "none"}[action]
        got = "critical" if code in critical else "warning" if code in warning else "none"
        if got != want:
            found.append(f"Xid {code}: {action} in the table, {got} in the alerts")
    return found


def run_promtool(rules_text: str, tests: list[dict[str, Any]], work: Path) -> subprocess.CompletedProcess[str]:
    """promtool test rules on the generated rules, annotations left out (the tests compare labels)."""
    doc = yaml.safe_load(rules_text)
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (work / "rules.yml").write_text(yaml.safe_dump(doc))
    spec = work / "tests.yml"
    spec.write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}))
    return subprocess.run([str(PROMTOOL), "test", "rules", str(spec)], capture_output=True, text=True,
                          check=False, cwd=work, timeout=120)


def series(gpu: str, xid: int) -> str:
    return f'nodeforge_gpu_xid_total{{gpu="{gpu}",xid="{xid}",instance="n1:9100",job="gpu"}}'


def alert(name: str, severity: str, action: str, gpu: str, xid: int) -> dict[str, Any]:
    return {"exp_labels": {"severity": severity, "action": action, "gpu": gpu, "xid": str(xid), **NODE}}


def case(inputs: dict[str, str], at: str, name: str, expected: list[dict[str, Any]]) -> dict[str, Any]:
    return {"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in inputs.items()],
            "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": expected}]}


# --- the generated rules under promtool --------------------------------------------------------------------------

@needs_promtool
def test_m4_a_critical_xid_is_not_resolved_by_a_later_application_xid(tmp_path: Path) -> None:
    # Xid 95 (uncontained ECC) at minute 2, then Xid 13 and 43 (application errors) at minutes 3 and 4:
    # the "last Xid" gauge would now read 43 and the critical alert would resolve
    inputs = {series("0", 95): "0 0 1 1 1 1 1 1", series("0", 13): "0 0 0 1 1 1 1 1",
              series("0", 43): "0 0 0 0 1 1 1 1"}
    tests = [case(inputs, t, "GpuXidCritical", [alert("GpuXidCritical", "critical", "reset", "0", 95)])
             for t in ("3m", "5m", "7m")]
    tests.append(case(inputs, "7m", "GpuXidWarning", []))  # 13 and 43 never page
    proc = run_promtool(xid_rules(), tests, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # and it resolves once the Xid has not recurred for a window
    later = [case({series("0", 95): "0 0 1x20"}, "15m", "GpuXidCritical", [])]
    assert run_promtool(xid_rules(), later, tmp_path).returncode == 0


@needs_promtool
@pytest.mark.parametrize(("xid", "action"), [(95, "reset"), (140, "reset"), (143, "drain"), (154, "drain"),
                                             (79, "drain"), (48, "reset")])
def test_m3_critical_xids_page(tmp_path: Path, xid: int, action: str) -> None:
    tests = [case({series("3", xid): "0 0 1 1 1"}, "4m", "GpuXidCritical",
                  [alert("GpuXidCritical", "critical", action, "3", xid)])]
    proc = run_promtool(xid_rules(), tests, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_m3_xid_68_does_not_page_and_a_first_xid_fires_at_once(tmp_path: Path) -> None:
    tests = [case({series("1", 68): "0 1 2 3 4"}, "4m", name, []) for name in ("GpuXidCritical", "GpuXidWarning")]
    # a series that first appears with the Xid (no earlier sample): increase() alone would miss it
    tests.append(case({series("2", 79): "_ _ 1 1 1"}, "3m", "GpuXidCritical",
                      [alert("GpuXidCritical", "critical", "drain", "2", 79)]))
    # a code the table does not know warns, as gpu-health's xid-unknown default says
    tests.append(case({series("2", 999): "0 1 1"}, "2m", "GpuXidWarning",
                      [alert("GpuXidWarning", "warning", "unknown", "2", 999)]))
    proc = run_promtool(xid_rules(), tests, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_site_overrides_reach_the_alerts(tmp_path: Path) -> None:
    text = xid_rules("--drain", "13", "--ignore", "95", "--window", "5m", "--unknown", "ignore")
    assert "[5m]" in text and 'xid!~' not in text
    tests = [case({series("0", 13): "0 1 1"}, "2m", "GpuXidCritical", [alert("GpuXidCritical", "critical",
                                                                             "drain", "0", 13)]),
             case({series("0", 95): "0 1 1"}, "2m", "GpuXidCritical", []),
             case({series("0", 999): "0 1 1"}, "2m", "GpuXidWarning", [])]
    proc = run_promtool(text, tests, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_generated_rules_pass_promtool_check_rules(tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(xid_rules())
    proc = subprocess.run([str(PROMTOOL), "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0 and "SUCCESS: 4 rules found" in proc.stdout, proc.stdout + proc.stderr
    assert yaml.safe_load(xid_rules())["groups"][0]["name"] == "gpu-xid"


def test_a_malformed_table_or_option_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "policy.tsv"
    bad.write_text("95\treboot\tuncontained\n")
    for argv in (["--policy", str(bad)], ["--policy", str(POLICY), "--window", "10x"],
                 ["--policy", str(POLICY), "--drain", "13;rm"]):
        proc = subprocess.run([sys.executable, str(RULES_PROGRAM), *argv], capture_output=True, text=True,
                              env=program_env(), check=False)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout


# --- the health check and the alerts read one table ----------------------------------------------------------------

def test_m3_the_old_hand_written_alerts_disagree_with_the_table_and_the_generated_ones_do_not() -> None:
    rows = policy_rows()
    old = disagreements(set(OLD_XID_CRITICAL), set(rows) - set(OLD_XID_CRITICAL), rows)
    # the review's rows: 68 paged (an application error), 95, 140, 143 and 154 did not
    for expected in ("Xid 68: ignore in the table, critical", "Xid 95: reset in the table, warning",
                     "Xid 140: reset in the table, warning", "Xid 143: drain in the table, warning",
                     "Xid 154: drain in the table, warning", "Xid 56: warn in the table, critical"):
        assert any(d.startswith(expected) for d in old), old
    text = xid_rules()
    assert disagreements(paging_codes(text, "critical"), paging_codes(text, "warning"), rows) == []


def health_classes(tmp_path: Path, codes: list[int], *args: str) -> dict[int, str]:
    """code -> critical / warning / none, as nodeforge-gpu-health judges one Xid of each code on GPU 0."""
    log = tmp_path / "kernel.log"
    log.write_text("".join(f"[{100 + i}.000000] NVRM: Xid (PCI:0000:1b:00): {code}, pid=4242, name=python3, "
                           f"test event\n" for i, code in enumerate(codes)))
    scenario = merge(tmp_path, GPU / "h100-sxm-8gpu", ROOT / "tests/fixtures/health-slurm-idle")
    env, _ = fake_tools(scenario, tmp_path)
    proc = subprocess.run([sys.executable, str(HEALTH), "--config", "/dev/null",
                           "--nvidia-smi", str(FAKES / "nvidia-smi"), "--kernel-log", str(log),
                           "--xid-policy", str(POLICY), "--drain", "no", "--json",
                           "--state-dir", str(tmp_path / "state"), *args],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    doc = json.loads(proc.stdout)
    classes = {code: "none" for code in codes}
    for f in doc["findings"]:
        m = re.search(r"Xid (\d+) x", f["detail"])
        if f["rule"] == "xid" and m:
            classes[int(m.group(1))] = f["severity"].lower()
    return classes


@needs_promtool
@pytest.mark.parametrize("overrides", [[], ["13"]], ids=["table", "site-drains-13"])
def test_m3_health_check_and_alerts_agree_on_every_code(tmp_path: Path, overrides: list[str]) -> None:
    codes = [*sorted(policy_rows()), 999]  # and one code the table does not know
    health_args = ["--xid-drain", overrides[0]] if overrides else []
    classes = health_classes(tmp_path, codes, *health_args)
    assert classes[95] == "critical" and classes[13] == ("critical" if overrides else "none")
    text = xid_rules(*(["--drain", overrides[0]] if overrides else []))
    rows = policy_rows()
    inputs = {series("0", code): "0 1 1 1" for code in codes}
    tests = []
    for name, severity in (("GpuXidCritical", "critical"), ("GpuXidWarning", "warning")):
        expected = []
        for code in codes:
            if classes[code] != severity:
                continue
            action = "unknown" if code not in rows else ("drain" if overrides and code == 13 else rows[code])
            expected.append(alert(name, severity, action, "0", code))
        tests.append(case(inputs, "3m", name, expected))
    proc = run_promtool(text, tests, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
