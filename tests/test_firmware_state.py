"""firmware (F1): "updated" only when the wanted version runs; a flash that waits for a reset is needs-reset.

The first-boot update (layers/firmware/files/firmware-update) runs against the fake mstflint
(tests/fakes/bin/replay) on the recorded ConnectX-7 scenarios in tests/fixtures/firmware, with
the settings the layer renders by default (read from the layer's own parameters).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import yaml
from support.fake_tools import fake, fake_tools

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "firmware"
LAYER = ROOT / "layers" / "firmware"
SCRIPT = LAYER / "files" / "firmware-update"
WANTED = "28.39.1002"
IMAGE = "fw-ConnectX7-28.39.1002.bin"
PARAMS = yaml.safe_load((LAYER / "layer.yaml").read_text())["params"]


def run(tmp: Path, scenario: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]], dict[str, str]]:
    """One boot's run against `scenario`, with the layer's default labels and expressions."""
    fw = tmp / "firmware"
    if not fw.exists():
        fw.mkdir(parents=True)
        (fw / IMAGE).write_bytes(b"image 28.39.1002")
        (fw / "SHA256SUMS").write_text(f"{hashlib.sha256((fw / IMAGE).read_bytes()).hexdigest()}  {IMAGE}\n")
        (tmp / "textfile").mkdir()
    settings = {
        "COMPONENT": "nic", "TOOL": fake("mstflint"), "QUERY_ARGS": "-d 0000:3b:00.0 query",
        "VERSION_LABEL": PARAMS["version_label"]["default"],
        "RUNNING_LABEL": PARAMS["running_version_label"]["default"],
        "FLASH_ARGS": "-d 0000:3b:00.0 -i {image} -y burn", "IMAGE": IMAGE, "WANTED": WANTED,
        "POWER_CYCLE_REGEX": PARAMS["power_cycle_regex"]["default"], "RESET_REGEX": PARAMS["reset_regex"]["default"],
        "DRY_RUN": "false", "FIRMWARE_DIR": str(fw), "STATE_DIR": str(tmp / "state"),
        "TEXTFILE_DIR": str(tmp / "textfile"),
    }
    (tmp / "firmware-update.conf").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    env, calls = fake_tools(FIXTURES / scenario, tmp, NODEFORGE_FIRMWARE_CONF=str(tmp / "firmware-update.conf"))
    before = len(calls)
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    state_file = tmp / "state" / "nic.state"
    state = dict(line.split("=", 1) for line in state_file.read_text().splitlines()) if state_file.exists() else {}
    return proc, calls.argv()[before:], state


def burns(calls: list[list[str]]) -> list[list[str]]:
    return [c for c in calls if "burn" in c]


def outcome_metric(tmp: Path) -> str:
    text = (tmp / "textfile" / "nodeforge_firmware_nic.prom").read_text()
    (hit,) = re.findall(r'outcome="([a-z-]+)"\} 1', text)
    return hit


def test_f1_burn_that_waits_for_a_reset_is_needs_reset_not_updated(tmp_path: Path) -> None:
    proc, calls, state = run(tmp_path, "connectx7-outdated")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(burns(calls)) == 1
    assert (state["outcome"], state["before"], state["after"]) == ("needs-reset", "28.38.1002", "28.38.1002")
    assert outcome_metric(tmp_path) == "needs-reset"
    assert "mlxfwreset or a reboot loads it" in proc.stdout


def test_f1_next_boots_wait_for_the_reset_then_record_current(tmp_path: Path) -> None:
    run(tmp_path, "connectx7-outdated")
    again, calls, state = run(tmp_path, "connectx7-pending")           # rebooted, the NIC not reset yet
    assert again.returncode == 0 and burns(calls) == [], "a flashed image must not be burnt again"
    assert "waits for a reset" in again.stdout and state["outcome"] == "needs-reset"
    done, calls, state = run(tmp_path, "connectx7-current")            # after mlxfwreset / a reboot
    assert burns(calls) == [] and state["outcome"] == "current"
    assert "the reset brought up 28.39.1002" in done.stdout


def test_f1_flash_already_holding_the_wanted_image_is_not_burnt_again(tmp_path: Path) -> None:
    """No state file (a re-imaged node), but the flash holds 28.39.1002 and 28.38.1002 runs."""
    proc, calls, state = run(tmp_path, "connectx7-pending")
    assert proc.returncode == 0, proc.stderr
    assert burns(calls) == [] and state["outcome"] == "needs-reset"
    assert "the flash holds 28.39.1002" in proc.stdout


def test_f1_updated_only_when_the_wanted_version_runs(tmp_path: Path) -> None:
    proc, calls, state = run(tmp_path, "connectx7-activated")
    assert proc.returncode == 0, proc.stderr
    assert len(burns(calls)) == 1
    assert (state["outcome"], state["after"]) == ("updated", WANTED)
    assert outcome_metric(tmp_path) == "updated"


def test_f1_default_expressions_read_mstflint_s_reset_message() -> None:
    burn = (FIXTURES / "connectx7-outdated" / "firmware-burn-ok.txt").read_text()
    assert re.search(PARAMS["reset_regex"]["default"], burn, re.IGNORECASE)
    assert not re.search(PARAMS["power_cycle_regex"]["default"], burn, re.IGNORECASE)
    assert re.search(PARAMS["power_cycle_regex"]["default"], "Please perform a DC Power Cycle", re.IGNORECASE)
    assert PARAMS["running_version_label"]["default"] in \
        (FIXTURES / "connectx7-outdated" / "firmware-query-28.39-flashed.txt").read_text()
