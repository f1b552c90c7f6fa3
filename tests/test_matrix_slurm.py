"""`nodeforge matrix ... --submit slurm` against Debian's own slurmctld and slurmd on this machine
(tests/support/slurm.py): one batch job per variant, the variant that shares a leader's keys waits for
it (afterok) and finds them built; each job's output is its build's."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import slurm

from builder.cli import main

IMAGES = ["images/cuda-13.0-base.yaml", "images/cuda-13.0-base-distroless.yaml"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    missing = [d for d in slurm.DAEMONS if shutil.which(d) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run `make setup`")
    with slurm.cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield env


def test_variants_run_as_jobs_the_sharing_one_after_its_leader(cluster: dict[str, str], root: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              docker_client: object) -> None:
    monkeypatch.setenv("SLURM_CONF", cluster["SLURM_CONF"])
    assert main(["matrix", *(str(root / i) for i in IMAGES), "--submit", "slurm",
                 "--sbatch-arg=--partition=build"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [v["name"] for v in doc["variants"]]
    assert names == ["cuda-13.0-base", "cuda-13.0-base-distroless"]
    assert any(set(s["variants"]) == set(names) for s in doc["shared"])  # the base chain's keys
    leader, follower = doc["jobs"]
    assert leader["after"] == [] and follower["after"] == [leader["job_id"]]
    states = slurm.wait(cluster, [leader["job_id"], follower["job_id"]])
    assert {s["JobState"] for s in states.values()} == {"COMPLETED"}, states
    assert states[follower["job_id"]]["StartTime"] >= states[leader["job_id"]]["EndTime"]
    for j, v in zip(doc["jobs"], doc["variants"], strict=True):
        out = Path(j["output"]).read_text()
        assert "images:" in out and v["tags"][0] in out, out[-2000:]
    # the follower built nothing its leader had built: every shared step was there when it started
    follower_out = Path(follower["output"]).read_text()
    rebuilt = [x for x in follower_out.splitlines() if x.startswith("[cuda-13.0-base] ") and "building" in x]
    assert not rebuilt, rebuilt


def test_sbatch_options_nodeforge_sets_are_refused(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", str(root / IMAGES[0]), "--submit", "slurm", "--sbatch-arg=--dependency=afterany:1"]) == 2
    assert "nodeforge sets" in capsys.readouterr().err


def test_the_job_script_quotes_every_value(root: Path) -> None:
    from builder.compose.params import parse_sets
    from builder.compose.variants import variants
    from builder.definitions.load import load_tree
    from builder.slurm import dependencies, script

    sets = parse_sets(["sysctl.tcp_rmem=4096 87380 16777217"])  # the value checks refuse shell in it anyway
    found = variants(load_tree(root), ["node-minimal"], ["default"], sets)
    text = script(found[0], Path("/srv/node $(forge) tree"))
    assert "cd '/srv/node $(forge) tree'" in text and """'sysctl.tcp_rmem="4096 87380 16777217"'""" in text
    assert dependencies(found) == [[]]
