"""nodeforge-nccl-bench (layers/nccl-bench) on recorded nccl-tests all_reduce_perf output, text and -J JSON:
an 8 x H100 NVLink run that passes, a degraded one, one with wrong results and one cut short."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.fake_tools import fake, fake_tools, program_env
from support.metrics import assert_promtool_accepts
from support.trees import nodeforge, scratch_image, tree_with_layers

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "layers" / "nccl-bench" / "files" / "nccl-bench.py"
NCCL = ROOT / "tests" / "fixtures" / "nccl"
GIB = 1 << 30


def bench(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--config", os.devnull, *args], capture_output=True,
                          text=True, env=env or program_env(), timeout=60, check=False)
    assert proc.stderr == "", proc.stderr
    return proc.returncode, proc.stdout


def verdict(name: str, *args: str) -> tuple[int, dict[str, Any]]:
    rc, out = bench("parse", str(NCCL / name), "--json", *args)
    doc: dict[str, Any] = json.loads(out)
    return rc, doc


@pytest.mark.parametrize("fmt", ["txt", "json"])
def test_healthy_nvlink_run_passes(fmt: str) -> None:
    rc, doc = verdict(f"nccl-h100-8gpu-healthy.{fmt}", "--floor", "400", "--min-bytes", str(GIB))
    assert rc == 0 and doc["verdict"] == "PASS" and doc["reasons"] == []
    assert doc["gpus"] == 8 and doc["complete"] is True and doc["source"] == ("json" if fmt == "json" else "text")
    assert len(doc["results"]) == 31  # 8 B .. 8 GiB, factor 2
    largest = doc["results"][-1]
    assert largest["size"] == 8 * GIB
    assert largest["out_of_place"]["busbw"] == pytest.approx(480.63, abs=0.01)
    assert largest["in_place"]["busbw"] == pytest.approx(477.99, abs=0.01)
    assert doc["largest"] == {"size": 8 * GIB, "busbw": pytest.approx(477.99, abs=0.01)}  # the lower side
    assert doc["avg_busbw"] == pytest.approx(167.261, abs=0.001)


def test_text_and_json_agree() -> None:
    _, text = verdict("nccl-h100-8gpu-healthy.txt")
    _, js = verdict("nccl-h100-8gpu-healthy.json")
    for a, b in zip(text["results"], js["results"], strict=True):
        assert a["size"] == b["size"]
        for place in ("out_of_place", "in_place"):
            # the table prints 2 decimals, the JSON 6
            assert a[place]["busbw"] == pytest.approx(b[place]["busbw"], abs=0.006)
            assert a[place]["wrong"] == b[place]["wrong"]


@pytest.mark.parametrize("fmt", ["txt", "json"])
def test_degraded_run_fails_the_floor(fmt: str) -> None:
    rc, doc = verdict(f"nccl-h100-8gpu-degraded.{fmt}", "--floor", "400")
    assert rc == 2 and doc["verdict"] == "FAIL"
    (reason,) = doc["reasons"]
    assert reason.startswith("bus bandwidth below 400 GB/s: ") and f"at {8 * GIB} B" in reason
    # the same run passes a floor it meets: the floor is what fails it
    assert verdict(f"nccl-h100-8gpu-degraded.{fmt}", "--floor", "140")[0] == 0


def test_floor_applies_only_from_the_size_threshold() -> None:
    # small messages are latency-bound: 64 KiB reaches only a few GB/s even on a healthy node
    rc, doc = verdict("nccl-h100-8gpu-healthy.txt", "--floor", "400", "--min-bytes", "65536")
    assert rc == 2 and "at 65536 B" in doc["reasons"][0]
    rc, doc = verdict("nccl-h100-8gpu-healthy.txt", "--floor", "400", "--min-bytes", str(16 * GIB))
    assert rc == 3 and doc["reasons"] == [f"no size of at least {16 * GIB} B was measured"]


@pytest.mark.parametrize("fmt", ["txt", "json"])
def test_wrong_results_fail_whatever_the_bandwidth(fmt: str) -> None:
    rc, doc = verdict(f"nccl-h100-8gpu-wrong.{fmt}", "--floor", "400")
    assert rc == 2
    assert doc["reasons"][0] == f"wrong results: 16384 at {GIB} B, 32775 at {2 * GIB} B"
    assert doc["out_of_bounds"] == 3 and "3 out-of-bounds" in doc["reasons"][1]
    assert not any("bandwidth" in r for r in doc["reasons"])  # 476 GB/s: the bandwidth is fine


@pytest.mark.parametrize("fmt", ["txt", "json"])
def test_truncated_run_fails(fmt: str) -> None:
    rc, doc = verdict(f"nccl-h100-8gpu-truncated.{fmt}")
    assert rc == 2 and doc["complete"] is False
    assert doc["reasons"][0].startswith("truncated: the output stops after 67108864 B")
    assert len(doc["results"]) == 24 and doc["gpus"] == 8
    if fmt == "txt":
        assert "unhandled cuda error" in doc["reasons"][0]


def test_no_table_is_unknown(tmp_path: Path) -> None:
    out = tmp_path / "crash.txt"
    out.write_text("# nccl-tests version 2.19.6 nccl-headers=22807 nccl-library=22807\n"
                   "gpu01: Test CUDA failure common.cu:1120 'no CUDA-capable device is detected'\n")
    rc, text = bench("parse", str(out))
    assert rc == 3 and text.startswith("NCCL-BENCH UNKNOWN") and "no CUDA-capable device" in text


def test_textfile_metric(tmp_path: Path) -> None:
    rc, _ = bench("parse", str(NCCL / "nccl-h100-8gpu-wrong.txt"), "--textfile", str(tmp_path))
    prom = (tmp_path / "nccl_bench.prom").read_text()
    assert rc == 2
    assert 'nodeforge_nccl_bench_pass{collective="all_reduce"} 0\n' in prom
    assert 'nodeforge_nccl_bench_wrong_results{collective="all_reduce"} 49159\n' in prom
    assert (f'nodeforge_nccl_bench_busbw_gbytes_per_second{{collective="all_reduce",placement="out_of_place",'
            f'size="{8 * GIB}"}} ') in prom
    assert_promtool_accepts(prom)


# --- the runner ---------------------------------------------------------------------------------------------------

def runner(tmp_path: Path, scenario: str, *args: str) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    env, calls = fake_tools(NCCL / scenario, tmp_path)
    rc, out = bench("run", "--binary", fake("all_reduce_perf"), "--json", *args, env=env)
    doc: dict[str, Any] = json.loads(out)
    return rc, doc, calls()


def test_runner_calls_the_configured_binary_and_judges(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    rc, doc, calls = runner(tmp_path, "run-healthy", "--floor", "400", "--output", str(raw),
                            "--textfile", str(tmp_path))
    assert rc == 0 and doc["verdict"] == "PASS"
    assert calls == [{"tool": "all_reduce_perf", "argv": ["-b", "8", "-e", "8G", "-f", "2", "-g", "8"]}]
    assert raw.read_text() == (NCCL / "nccl-h100-8gpu-healthy.txt").read_text()
    assert (tmp_path / "nccl_bench.prom").is_file()


def test_runner_falls_back_to_text_when_no_json_was_written(tmp_path: Path) -> None:
    rc, doc, calls = runner(tmp_path, "run-healthy", "--json-output", "--", "-b", "8", "-e", "8G", "-f", "2", "-g", "8")
    # the replayed binary writes no -J file, so the text output is judged
    assert calls[0]["argv"][:8] == ["-b", "8", "-e", "8G", "-f", "2", "-g", "8"] and calls[0]["argv"][8] == "-J"
    assert rc == 0 and doc["source"] == "text"


def test_runner_reports_a_crashed_run(tmp_path: Path) -> None:
    rc, doc, _ = runner(tmp_path, "run-truncated")
    assert rc == 2 and doc["reasons"][0].startswith("truncated:")


def test_runner_without_nccl_tests_says_how_to_get_it(tmp_path: Path) -> None:
    rc, out = bench("run", "--binary", str(tmp_path / "all_reduce_perf"))
    assert rc == 3 and "not packaged by Debian" in out and "NVIDIA/nccl-tests" in out


# --- the layer: rendered settings drive the runner -----------------------------------------------------------------

def render(tmp_path: Path, kind: str) -> Path:
    image = scratch_image("nccl-scratch", "an image with the nccl-bench layer",
                          ["base", {"nccl-bench": {"floor_gbps": 400}}], kind=kind)
    tree = tree_with_layers(tmp_path, ("base", "node-lib", "nccl-bench"), {"nccl-scratch": image},
                            {"hgx": "name: hgx\nsummary: s\nsite:\n  gpu: {model: H100, count: 8}\n"})
    out = tmp_path / "render"
    proc = nodeforge(tree, "render", "nccl-scratch", str(out), "-c", "hgx")
    assert proc.returncode == 0, proc.stderr
    (conf,) = out.glob("*-nccl-bench/root/etc/nodeforge/nccl-bench.conf")
    return conf


def test_rendered_settings_drive_the_runner(tmp_path: Path) -> None:
    conf = render(tmp_path, "container")
    text = conf.read_text()
    assert "args = -b 8 -e 8G -f 2 -g 8\n" in text and "floor = 400.0\n" in text and "textfile = \n" in text
    env, _ = fake_tools(NCCL / "run-healthy", tmp_path)
    proc = subprocess.run([sys.executable, str(SCRIPT), "run", "--config", str(conf),
                           "--binary", fake("all_reduce_perf")],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("NCCL-BENCH PASS"), proc.stdout + proc.stderr
    assert "(floor 400 GB/s" in proc.stdout
    degraded = subprocess.run([sys.executable, str(SCRIPT), "parse", str(NCCL / "nccl-h100-8gpu-degraded.txt"),
                               "--config", str(conf)], capture_output=True, text=True, env=program_env(), timeout=60,
                              check=False)
    assert degraded.returncode == 2


def test_node_images_publish_the_metric(tmp_path: Path) -> None:
    assert "textfile = /var/lib/prometheus/node-exporter\n" in render(tmp_path, "node").read_text()


def test_n1_floor_is_not_handed_to_nccl_tests_average_check(tmp_path: Path) -> None:
    """N1: nccl-tests exits non-zero when its *average* bus bandwidth (over every size, small ones
    included) is under NCCL_TESTS_MIN_BW; the judge applies the floor per size from --min-bytes, so
    the variable must not reach the binary (nor leak through from the caller's environment)."""
    seen = tmp_path / "seen-env"
    binary = tmp_path / "all_reduce_perf"
    binary.write_text("#!/bin/sh\n"
                      f"echo \"NCCL_TESTS_MIN_BW=${{NCCL_TESTS_MIN_BW-unset}}\" > '{seen}'\n"
                      f"cat '{NCCL / 'nccl-h100-8gpu-healthy.txt'}'\n")
    binary.chmod(0o755)
    rc, out = bench("run", "--binary", str(binary), "--json", "--floor", "400",
                    env=program_env(NCCL_TESTS_MIN_BW="9999"))
    assert rc == 0 and json.loads(out)["verdict"] == "PASS"
    assert seen.read_text().strip() == "NCCL_TESTS_MIN_BW=unset"
