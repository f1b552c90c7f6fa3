"""Bookworm's own slurmd and slurmctld parse the configuration the slurm-gpu layer generates.

A small image with Debian's slurmd and slurmctld is defined in a copy of the tree (never in
images/) and built once per session from the tree's container-base. The files come from the
composed plan of node-minimal with configs/v100-slurm.yaml (slurm-gpu.controller set, so the
layer writes its complete minimal slurm.conf too). `slurmd -G` prints the GRES configuration it
parsed; `slurmctld -D` must start and keep running on the minimal cluster configuration. A gres.conf
without one device line, or a slurm.conf that declares another count, must fail the check."""

from __future__ import annotations

import io
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from builder.compose import compose
from builder.compose.params import parse_sets
from builder.definitions.load import load_tree

ROOT = Path(__file__).resolve().parent.parent
NODE = "v100-01"  # the first node of slurm-gpu.node_names in configs/v100-slurm.yaml
GPUS = 4
SLURM_FILES = {  # path in the image -> path the parse test uses
    "/etc/slurm/gres.conf": "/etc/slurm/gres.conf",
    "/etc/slurm/nodeforge-gpu-nodes.conf": "/etc/slurm/nodeforge-gpu-nodes.conf",
    "/etc/slurm/cgroup.conf": "/etc/slurm/cgroup.conf",
    "/etc/slurm/nodeforge-cluster.conf": "/etc/slurm/slurm.conf",
}

PARSE_LAYER = """\
name: slurm-parse
summary: Debian's slurmd and slurmctld, to parse generated Slurm configuration
applies-to: [container]
requires: [base]
packages:
  apt: [slurmd, slurmctld, libpmix2]
steps:
  - name: the PMIx library where mpi_pmix_v4.so opens it (as layers/slurm-gpu does)
    run: ln -sfn libpmix.so.2 /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so
"""
PARSE_IMAGE = """\
name: slurm-parse
summary: slurmd and slurmctld from bookworm on the tree's container-base
kind: container
version: "1"
from: {image: container-base}
layers: [slurm-parse]
outputs:
  tags: [nodeforge-test/slurm-parse:22.05]
"""


def generated(*sets: str) -> dict[str, str]:
    """The layer's Slurm files for v100-slurm, at the paths slurmd reads them from."""
    plan = compose(load_tree(ROOT), "node-minimal", "v100-slurm",
                   parse_sets(["slurm-gpu.controller=localhost", *sets]))
    files = {f.path: f.content for s in plan.steps for f in s.files if f.path in SLURM_FILES}
    assert set(files) == set(SLURM_FILES)
    out = {SLURM_FILES[p]: text for p, text in files.items() if text is not None}
    # the test container is not a 2 x 20-core node: slurmd takes the node line's topology as given
    out["/etc/slurm/slurm.conf"] += "SlurmdParameters=config_overrides\n"
    return out


def test_generated_slurm_conf_includes_the_fragment() -> None:
    files = generated()
    assert "include /etc/slurm/nodeforge-gpu-nodes.conf" in files["/etc/slurm/slurm.conf"]
    assert "Gres=gpu:v100:4" in files["/etc/slurm/nodeforge-gpu-nodes.conf"]


@pytest.fixture(scope="session")
def slurm_image(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The slurm-parse image, built once per session (each layer cached by key across sessions)."""
    from builder.pipeline import Builder
    from builder.progress import Progress

    tree = tmp_path_factory.mktemp("slurm-tree")
    for d in ("layers", "images", "configs"):
        shutil.copytree(ROOT / d, tree / d)
    (tree / "layers/slurm-parse").mkdir()
    (tree / "layers/slurm-parse/layer.yaml").write_text(PARSE_LAYER)
    (tree / "images/slurm-parse.yaml").write_text(PARSE_IMAGE)
    builder = Builder(load_tree(tree), None, [], Progress(), log_dir=tree / "logs")
    (result,) = [r for r in builder.build(["slurm-parse"]) if r.image == "slurm-parse"]
    return result.ref


@dataclass
class Run:
    code: int
    output: str


def run_slurm(client: Any, image: str, files: dict[str, str], script: str, timeout: int = 120) -> Run:
    """Run `script` in a container of `image` with `files` in place, as the node `NODE`."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    box = client.containers.create(image, ["bash", "-c", script], hostname=NODE, detach=True)
    try:
        box.put_archive("/", archive.getvalue())
        box.start()
        code = box.wait(timeout=timeout)["StatusCode"]
        return Run(code, box.logs(stdout=True, stderr=True).decode(errors="replace"))
    finally:
        box.remove(force=True)


# stand-in GPU device nodes (major 195, as the driver makes them): slurmd checks File= is a device
DEVICES = "for i in $(seq 0 7); do mknod /dev/nvidia$i c 195 $i; done; "


def parsed_gres(client: Any, image: str, files: dict[str, str]) -> tuple[Run, list[dict[str, str]]]:
    run = run_slurm(client, image, files, DEVICES + f"slurmd -N {NODE} -G")
    gres = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in run.output.splitlines()
            if re.search(r"\bName=gpu\b", line)]
    return run, gres


def gres_problems(client: Any, image: str, files: dict[str, str]) -> list[str]:
    """What is wrong with the GRES configuration as slurmd parsed it: [] when slurmd reports every GPU
    of the slurm.conf node line, each with its own /dev/nvidiaN and cores."""
    run, gres = parsed_gres(client, image, files)
    fragment = files["/etc/slurm/nodeforge-gpu-nodes.conf"]
    declared = re.search(r"Gres=gpu:(\w+):(\d+)", fragment)
    assert declared, fragment
    gtype, count = declared.group(1), int(declared.group(2))
    found = []
    if run.code != 0:
        found.append(f"slurmd -G exited {run.code}")
    if re.search(r"\b(fatal|error)\b", run.output, re.I):
        found.append("slurmd reported: " + "; ".join(line for line in run.output.splitlines()
                                                     if re.search(r"fatal|error", line, re.I)))
    if len(gres) != count:
        found.append(f"slurmd parsed {len(gres)} GPUs, slurm.conf declares gpu:{gtype}:{count}")
    files_seen = sorted(g.get("File", "") for g in gres)
    if files_seen != [f"/dev/nvidia{i}" for i in range(count)]:
        found.append(f"device files {files_seen}, expected /dev/nvidia0..{count - 1}")
    if any(g.get("Type") != gtype for g in gres):
        found.append(f"types {[g.get('Type') for g in gres]}, expected {gtype}")
    return found


@pytest.mark.docker
@pytest.mark.slow
def test_slurmd_parses_the_generated_gres_for_four_v100(docker_client: Any, slurm_image: str) -> None:
    files = generated()
    run, gres = parsed_gres(docker_client, slurm_image, files)
    assert run.code == 0, run.output
    assert [(g["Type"], g["File"], g["Cores"]) for g in gres] == [
        ("v100", "/dev/nvidia0", "0-19"), ("v100", "/dev/nvidia1", "0-19"),
        ("v100", "/dev/nvidia2", "20-39"), ("v100", "/dev/nvidia3", "20-39")], run.output
    assert gres_problems(docker_client, slurm_image, files) == []


def _without_nvidia2(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if "File=/dev/nvidia2 " not in line)


# a fault in the generated files -> (file, the change, what gres_problems must report)
FAULTS = {
    "a missing device line": ("/etc/slurm/gres.conf", _without_nvidia2,
                              "slurmd parsed 3 GPUs, slurm.conf declares gpu:v100:4"),
    "a wrong count": ("/etc/slurm/nodeforge-gpu-nodes.conf", lambda t: t.replace("Gres=gpu:v100:4", "Gres=gpu:v100:5"),
                      "slurmd parsed 4 GPUs, slurm.conf declares gpu:v100:5"),
    "OS CPU numbers in Cores": ("/etc/slurm/gres.conf", lambda t: t.replace("Cores=20-39", "Cores=40-79"),
                                "Invalid GRES data for gpu, Cores=40-79"),
}


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_gres_fault_fails(fault: str, docker_client: Any, slurm_image: str) -> None:
    path, change, expected = FAULTS[fault]
    files = generated()
    files[path] = change(files[path])
    found = gres_problems(docker_client, slurm_image, files)
    assert any(expected in p for p in found), found


@pytest.mark.docker
@pytest.mark.slow
def test_slurmd_reads_the_cgroup_conf_and_a_key_22_05_lacks_is_fatal(docker_client: Any, slurm_image: str) -> None:
    files = generated()
    assert gres_problems(docker_client, slurm_image, files) == []  # slurmd -G reads cgroup.conf too
    files["/etc/slurm/cgroup.conf"] += "EnableControllers=yes\n"  # a cgroup.conf key of Slurm 23.02
    run, _ = parsed_gres(docker_client, slurm_image, files)
    assert run.code != 0 and "unrecognized key: EnableControllers" in run.output, run.output
    assert "fatal: Could not open/read/parse cgroup.conf" in run.output


# slurmctld started in the background ($pid) and waited for until it is the primary controller or exits
START_SLURMCTLD = """
slurmctld -D -v > /tmp/slurmctld.log 2>&1 & pid=$!
for i in $(seq 1 90); do
    grep -q 'Running as primary controller' /tmp/slurmctld.log && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
done
"""


@pytest.mark.docker
@pytest.mark.slow
def test_slurmctld_starts_on_the_minimal_cluster_config(docker_client: Any, slurm_image: str) -> None:
    files = generated()
    script = """
        service munge start >/dev/null 2>&1
    """ + START_SLURMCTLD + """
        if kill -0 $pid 2>/dev/null; then echo "slurmctld running"; kill $pid; wait $pid
        else wait $pid; echo "slurmctld exit $?"; fi
        cat /tmp/slurmctld.log
    """
    run = run_slurm(docker_client, slurm_image, files, script, timeout=180)
    assert "slurmctld running" in run.output and "Running as primary controller" in run.output, run.output
    assert "fatal" not in run.output.lower(), run.output
    assert re.search(r"slurmctld version 22\.05\.\d+ started on cluster gpu", run.output), run.output


@pytest.mark.docker
@pytest.mark.slow
def test_the_nvml_plugin_cannot_be_installed_beside_bookworms_slurm(docker_client: Any, slurm_image: str) -> None:
    """The fact behind slurm-gpu's refusal of autodetect=nvml, checked against the archive."""
    script = ("apt-get update -qq >/dev/null 2>&1 || { echo NO-ARCHIVE; exit 0; }; "
              "apt-get -s install slurm-wlm-nvml-plugin 2>&1")
    run = run_slurm(docker_client, slurm_image, {}, script, timeout=300)
    if "NO-ARCHIVE" in run.output:
        pytest.skip("the Debian archive cannot be reached from a container here")
    assert re.search(r"slurm-wlm-nvml-plugin : Depends: slurm-wlm-basic-plugins \(= [^)]+\) but \S+ is to be installed",
                     run.output), run.output


SHOW_CONFIG = """
    [ -s /etc/munge/munge.key ] || { mungekey -c -f; chown munge:munge /etc/munge/munge.key; }
    mkdir -p /run/munge && chown munge:munge /run/munge
    runuser -u munge -- /usr/sbin/munged || echo "munged did not start"
""" + START_SLURMCTLD + """
    for i in $(seq 1 30); do scontrol show config > /tmp/config 2>&1 && break; sleep 1; done
    cat /tmp/config
    kill $pid 2>/dev/null; wait $pid
    echo "--- slurmctld log"; cat /tmp/slurmctld.log
"""


def effective_config(client: Any, image: str, files: dict[str, str]) -> tuple[dict[str, str], str]:
    """`scontrol show config` of a real slurmctld running on `files`: {key: value}, and the whole output."""
    run = run_slurm(client, image, files, SHOW_CONFIG, timeout=180)
    config = dict(re.findall(r"^(\w+)\s+= (.*?)\s*$", run.output.split("--- slurmctld log")[0], re.M))
    return config, run.output


@pytest.mark.docker
@pytest.mark.slow
def test_s1_s3_slurmctld_applies_the_job_limits_and_plugins(docker_client: Any, slurm_image: str) -> None:
    files = generated()
    config, output = effective_config(docker_client, slurm_image, files)
    assert config.get("PropagateResourceLimitsExcept") == "MEMLOCK", output  # S1: jobs keep the node's memlock
    assert config.get("MpiDefault") == "pmix", output
    assert config.get("JobAcctGatherType") == "jobacct_gather/cgroup", output
    assert "Contain" in config.get("PrologFlags", ""), output
    assert config.get("Epilog") == "/usr/lib/nodeforge/gpu-health-epilog", output
    assert "fatal" not in output.lower() and not re.search(r"error: .*(pmix|mpi|jobacct)", output, re.I), output
    # the configuration before S1: every limit of the submitting shell, memlock included, reaches the job
    files["/etc/slurm/nodeforge-gpu-nodes.conf"] = "".join(
        line for line in files["/etc/slurm/nodeforge-gpu-nodes.conf"].splitlines(keepends=True)
        if not line.startswith("PropagateResourceLimitsExcept"))
    old, output = effective_config(docker_client, slurm_image, files)
    assert old.get("PropagateResourceLimits") == "ALL", output
    assert old.get("PropagateResourceLimitsExcept") in (None, "(null)"), output
