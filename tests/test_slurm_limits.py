"""slurm-gpu: jobs keep the node's limits and memory (gpu-review S1, S2, S3), as the layer composes them.

The engine tests in tests/test_slurm_gpu.py show Debian's slurmctld reading the same files
(`scontrol show config`); these read the composed plan of node-minimal with configs/v100-slurm.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.compose import compose
from builder.compose.params import parse_sets
from builder.definitions.load import load_tree
from builder.errors import DefinitionError

ROOT = Path(__file__).resolve().parent.parent
FRAGMENT = "/etc/slurm/nodeforge-gpu-nodes.conf"
CLUSTER = "/etc/slurm/nodeforge-cluster.conf"


def files(*sets: str) -> dict[str, str]:
    plan = compose(load_tree(ROOT), "node-minimal", "v100-slurm", parse_sets(list(sets)))
    return {f.path: f.content for s in plan.steps for f in s.files if f.content is not None}


def settings(text: str) -> dict[str, str]:
    skip = ("#", "NodeName", "PartitionName")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith(skip))


def test_s1_the_node_fragment_keeps_the_node_s_memlock_with_or_without_a_controller() -> None:
    for sets in ([], ["slurm-gpu.controller=ctl1"]):
        out = files(*sets)
        assert settings(out[FRAGMENT])["PropagateResourceLimitsExcept"] == "MEMLOCK"
    conf = files("slurm-gpu.controller=ctl1")[CLUSTER]
    assert "\ninclude /etc/slurm/nodeforge-gpu-nodes.conf\n" in conf  # the written slurm.conf carries it too
    assert "PropagateResourceLimits=" not in conf  # nothing there propagates the submit host's limits again


def test_s2_a_controller_without_real_memory_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError) as e:
        files("slurm-gpu.controller=ctl1", "slurm-gpu.real_memory_mib=0")
    (problem,) = [p for p in e.value.problems if "real-memory-with-controller" in p.path]
    assert "real_memory_mib is 0" in problem.message and "MinRAMSpace" in problem.message
    assert "slurmd -C" in str(e.value) or "slurmd -C" in (problem.remedy or "")
    assert "RealMemory=380000 " in files("slurm-gpu.controller=ctl1")[FRAGMENT]
    files("slurm-gpu.real_memory_mib=0")  # no controller: the site's slurm.conf decides


def test_s3_pmix_cgroup_accounting_contain_and_the_gpu_health_epilog() -> None:
    conf = settings(files("slurm-gpu.controller=ctl1")[CLUSTER])
    assert conf["MpiDefault"] == "pmix" and conf["JobAcctGatherType"] == "jobacct_gather/cgroup"
    assert conf["PrologFlags"] == "Contain"
    epilog = "/usr/lib/nodeforge/gpu-health-epilog"
    assert conf["Epilog"] == epilog
    plan = compose(load_tree(ROOT), "node-minimal", "v100-slurm")
    assert epilog in {f.path for s in plan.steps for f in s.files}  # gpu-health installs it where slurm.conf names it
    assert "Epilog" not in settings(files("slurm-gpu.controller=ctl1", "slurm-gpu.epilog=")[CLUSTER])
    other = settings(files("slurm-gpu.controller=ctl1", "slurm-gpu.epilog=/usr/local/sbin/epilog")[CLUSTER])
    assert other["Epilog"] == "/usr/local/sbin/epilog"
    assert settings(files("slurm-gpu.controller=ctl1", "slurm-gpu.mpi_default=pmi2")[CLUSTER])["MpiDefault"] == "pmi2"


def test_s3_an_epilog_that_is_not_a_plain_path_is_refused() -> None:
    with pytest.raises(DefinitionError) as e:
        files("slurm-gpu.controller=ctl1", "slurm-gpu.epilog=/x;reboot")
    assert any("epilog" in p.path for p in e.value.problems)


def test_s3_the_pmix_library_is_where_slurm_s_plugin_opens_it() -> None:
    plan = compose(load_tree(ROOT), "node-minimal", "v100-slurm")
    assert "libpmix2" in plan.packages
    (step,) = [s for s in plan.steps if s.layer == "slurm-gpu"]
    assert "\nln -sfn libpmix.so.2 /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so\n" in step.apply
