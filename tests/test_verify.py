"""Verification against real images: passing and failing checks at image and container scope,
skips with reasons, JUnit XML and JSON reports, exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import docker
import pytest

from builder.pipeline import BuildResult

ROOT = Path(__file__).resolve().parent.parent
SHA_ALPHA = "ce95eac7620f5323366f89ba4b99ea988e607b384606971c97a646b47f5a7f21"  # sha256 of "alpha=1\n"

CHECKS = """name: checks
summary: checks that pass and checks that fail, on purpose
files:
  - {path: /etc/checks.conf, content: "alpha=1\\n", mode: "0640"}
  - {path: /etc/gpuops.conf, content: "owned\\n", mode: "0600", owner: gpuops, group: gpuops}
users:
  - {name: gpuops, uid: 1500, system: false}
steps:
  - name: record the build step
    run: echo "step ran as $(id -un)" > /etc/checks-step.txt
env: {CHECKS_MODE: strict}
labels: {org.example.team: gpu-infra}
tests:
  - {name: file passes, file: {path: /etc/checks.conf, mode: "0640", owner: root, content: {contains: [alpha=1]}}}
  - {name: file content fails, file: {path: /etc/checks.conf, content: {contains: [beta=2]}}}
  - {name: file mode fails, file: {path: /etc/checks.conf, mode: "0644"}}
  - {name: absent file passes, file: {path: /etc/shadow-key.pem, exists: false}}
  - {name: owner from users passes, file: {path: /etc/gpuops.conf, mode: "0600", owner: gpuops, group: gpuops}}
  - {name: step ran, file: {path: /etc/checks-step.txt, content: {equals: step ran as root}}}
  - {name: command as user, command: {run: id -u, user: gpuops, stdout: {equals: "1500"}}}
  - {name: package passes, package: {name: ca-certificates}}
  - {name: missing package fails, package: {name: cowsay}}
  - {name: env passes, env: {name: CHECKS_MODE, value: strict}}
  - {name: env fails, env: {name: CHECKS_MODE, value: lax}}
  - {name: label passes, label: {name: org.example.team, value: gpu-infra}}
  - name: command passes
    command: {run: "echo hello; echo oops >&2", stdout: {equals: hello}, stderr: {contains: [oops]}}
  - {name: command exit fails, command: {run: "exit 3"}}
  - {name: command times out, command: {run: "sleep 30", timeout: 2}}
  - {name: command in container sees file, scope: container, file: {path: /etc/checks.conf, mode: "0640"}}
  - name: container file sha256 fails
    scope: container
    file:
      path: /etc/checks.conf
      sha256: "0000000000000000000000000000000000000000000000000000000000000000"
  - {name: container file type fails, scope: container, file: {path: /etc/checks.conf, type: directory}}
  - name: container file type and sha256 pass
    scope: container
    file:
      path: /etc/checks.conf
      type: file
      sha256: "ce95eac7620f5323366f89ba4b99ea988e607b384606971c97a646b47f5a7f21"
  - {name: needs a gpu, requires: [gpu], command: {run: nvidia-smi -L}}
  - {name: boot only, sysctl: {key: vm.swappiness, value: 1}}
"""

IMAGE = """name: checked
summary: an image whose tests partly fail
kind: container
from:
  debian: {suite: bookworm, components: [main, contrib, non-free, non-free-firmware]}
source-date-epoch: 1735689600
layers: [base, checks]
outputs: {tags: ["nodeforge-test/checked:1"]}
"""


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory, docker_client: docker.DockerClient) -> Path:
    t = tmp_path_factory.mktemp("checked")
    for d in ("layers", "configs"):
        shutil.copytree(ROOT / d, t / d)
    (t / "images").mkdir()
    (t / "images" / "checked.yaml").write_text(IMAGE)
    (t / "layers" / "checks").mkdir()
    (t / "layers" / "checks" / "layer.yaml").write_text(CHECKS)
    proc = cli(t, "build", "checked", "-q")
    assert proc.returncode == 0, proc.stderr
    return t


def cli(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", "--root", str(tree), *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_failing_checks_fail_with_reasons(checked: Path, tmp_path: Path) -> None:
    proc = cli(checked, "test", "checked", "--report", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "checked.json").read_text())
    by = {r["name"]: r for r in data["results"]}
    expect = {
        "file passes": "passed", "file content fails": "failed", "file mode fails": "failed",
        "absent file passes": "passed", "owner from users passes": "passed", "step ran": "passed",
        "command as user": "passed", "package passes": "passed", "missing package fails": "failed",
        "env passes": "passed", "env fails": "failed", "label passes": "passed", "command passes": "passed",
        "command exit fails": "failed", "command times out": "failed", "command in container sees file": "passed",
        "needs a gpu": "skipped", "boot only": "not-run", "container file sha256 fails": "failed",
        "container file type fails": "failed", "container file type and sha256 pass": "passed",
    }
    for name, status in expect.items():
        assert by[name]["status"] == status, (name, by[name])
    assert "does not contain 'beta=2'" in by["file content fails"]["message"]
    assert "mode 0640, expected 0644" in by["file mode fails"]["message"]
    assert "cowsay is not installed" in by["missing package fails"]["message"]
    assert "exit status 3, expected 0" in by["command exit fails"]["message"]
    assert "timed out after 2s" in by["command times out"]["message"]
    assert "requires gpu" in by["needs a gpu"]["message"]
    assert "not a node image" in by["boot only"]["message"]
    assert f"sha256 {SHA_ALPHA}, expected {'0' * 64}" in by["container file sha256 fails"]["message"]
    assert "is a file, expected a directory" in by["container file type fails"]["message"]
    suites = ET.parse(tmp_path / "checked.junit.xml").getroot()
    cases = suites.findall(".//testcase")
    assert len(cases) >= len(expect)
    assert sum(1 for c in cases if c.find("failure") is not None) == data["counts"]["failed"] == 8


def test_node_minimal_passes_its_tests(built_node_minimal: BuildResult, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "builder", "test", "images/node-minimal.yaml", "-c", "default",
                           "--report", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "node-minimal.json").read_text())
    names = {r["name"]: r["status"] for r in data["results"]}
    assert names["node exporter serves /metrics on 9100"] == "passed"
    assert names["sysctl file carries swappiness"] == "passed"
    counts = data["counts"]
    assert counts["failed"] == 0
    # every test of the plan has a result; only boot-scope ones wait for --boot
    assert counts["passed"] + counts["not-run"] == len(built_node_minimal.plan.tests)
    assert counts["not-run"] == sum(t.scope == "boot" for t in built_node_minimal.plan.tests)
    assert (tmp_path / "node-minimal.junit.xml").is_file()


@pytest.mark.engine  # without an engine the answer is that no engine answers, not that the image is unbuilt
def test_unbuilt_image_is_an_environment_error(tmp_path: Path) -> None:
    t = tmp_path / "t"
    for d in ("layers", "configs", "images"):
        shutil.copytree(ROOT / d, t / d)
    image = t / "images" / "node-minimal.yaml"
    text = image.read_text().replace("nodeforge/node-minimal:0.1.0", "nodeforge-test/never:0")
    image.write_text(text)
    proc = cli(t, "test", "node-minimal", "--report", str(tmp_path / "r"))
    assert proc.returncode == 2 and "is not built" in proc.stderr


def test_dpkg_status_parser() -> None:
    from builder.debian import parse_dpkg_status

    text = ("Package: a\nStatus: install ok installed\nVersion: 1\n\n"
            "Package: b\nStatus: deinstall ok config-files\nVersion: 2\n\n"
            "Package: c\nStatus: install ok installed\nArchitecture: i386\nVersion: 3\nDescription: x\n more\n")
    parsed = parse_dpkg_status(text)
    assert set(parsed) == {"a", "c:i386"} and parsed["c:i386"]["Description"] == "x\nmore"
