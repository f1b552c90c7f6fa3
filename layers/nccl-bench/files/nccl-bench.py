#!/usr/bin/env python3
"""nodeforge-nccl-bench: run nccl-tests' all_reduce_perf and judge its result.

  nodeforge-nccl-bench run [--binary PATH] [-- ARGS...]   run the benchmark, then judge it
  nodeforge-nccl-bench parse FILE                         judge a recorded output (text or -J JSON)

nccl-tests is not packaged by Debian: build it from NVIDIA/nccl-tests (make MPI=1 for several
nodes) and point --binary (or the layer's parameter) at all_reduce_perf.

Verdict: FAIL when any result has #wrong > 0, when nccl-tests reports out-of-bounds values,
when the bus bandwidth (the lower of out-of-place and in-place) at any size of at least
--min-bytes is below --floor GB/s, or when the output stops before its footer (a crashed or
killed run). UNKNOWN when the output has no result table, or no size reaches --min-bytes.
Exit status (Nagios): 0 PASS, 2 FAIL, 3 UNKNOWN.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeforge_node import Metrics, config_defaults, finish, write_atomic

PASS, FAIL, UNKNOWN = 0, 2, 3
NAMES = {PASS: "PASS", FAIL: "FAIL", UNKNOWN: "UNKNOWN"}
PLACES = ("out_of_place", "in_place")


@dataclass
class Side:
    time_us: float | None
    algbw: float | None
    busbw: float | None
    wrong: int | None  # None: not checked (-c 0 prints N/A)


@dataclass
class Row:
    size: int
    count: int
    type: str
    redop: str
    sides: dict[str, Side]

    def busbw(self) -> float | None:
        values = [s.busbw for s in self.sides.values() if s.busbw is not None]
        return min(values) if values else None

    def wrong(self) -> int:
        return sum(s.wrong or 0 for s in self.sides.values())


@dataclass
class Run:
    source: str  # text or json
    program: str = "all_reduce_perf"
    ngpus: int | None = None
    ranks: int = 0
    rows: list[Row] = field(default_factory=list)
    complete: bool = False
    out_of_bounds: int | None = None
    avg_busbw: float | None = None
    errors: list[str] = field(default_factory=list)


def number(token: str) -> float | None:
    try:
        v = float(token)
    except ValueError:
        return None
    return None if math.isnan(v) else v


def parse_text(text: str) -> Run:
    run = Run("text")
    columns: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            body = stripped[1:].strip()
            if m := re.match(r"Collective test starting: (\S+)", body):
                run.program = m.group(1)
            elif m := re.match(r"nThread (\d+) nGpus (\d+)", body):
                run.ngpus = int(m.group(2))
            elif body.startswith("Rank "):
                run.ranks += 1
            elif body.split()[:2] == ["size", "count"]:
                columns = body.split()
            elif m := re.match(r"Out of bounds values\s*:\s*(\d+)", body):
                run.out_of_bounds = int(m.group(1))
            elif m := re.match(r"Avg bus bandwidth\s*:\s*(\S+)", body):
                run.avg_busbw = number(m.group(1))
                run.complete = True
            elif body.startswith("error:"):
                run.errors.append(body)
            continue
        tokens = stripped.split()
        if columns and tokens and tokens[0].isdigit() and len(tokens) >= 13:
            run.rows.append(row_from_tokens(columns, tokens))
        elif re.search(r"failure|error|Error", stripped):
            run.errors.append(stripped)
    return run


def row_from_tokens(columns: list[str], tokens: list[str]) -> Row:
    # the header names each column; out-of-place comes first, in-place second, each group starting
    # with time (or cputime) and holding algbw, busbw, #wrong and, with per-iteration timing, i_* columns
    starts = [i for i, c in enumerate(columns) if c in ("time", "cputime")]
    sides: dict[str, Side] = {}
    for place, start in zip(PLACES, starts, strict=False):
        group = columns[start:]
        def pick(name: str, group: list[str] = group, start: int = start) -> str:
            i = start + group.index(name)
            return tokens[i] if i < len(tokens) else "N/A"
        wrong = pick("#wrong")
        sides[place] = Side(number(pick(columns[start])), number(pick("algbw")), number(pick("busbw")),
                            None if wrong == "N/A" else int(float(wrong)))
    return Row(int(tokens[0]), int(tokens[1]), tokens[2], tokens[3], sides)


def parse_json(text: str) -> Run:
    run = Run("json")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        # an unfinished file: nccl-tests writes the JSON as it goes and closes it at the end
        run.errors.append("the JSON output stops before its end (the run did not finish)")
        if m := re.search(r'"ngpus":(\d+)', text):
            run.ngpus = int(m.group(1))
        rows_text = re.findall(r'\{"size":.*?"experiment_name":"[^"]*"\}', text)
        for item in rows_text:
            run.rows.append(row_from_json(json.loads(item)))
        return run
    config = doc.get("config") or {}
    run.ngpus = config.get("ngpus")
    run.ranks = len(config.get("devices") or [])
    run.rows = [row_from_json(r) for r in doc.get("results") or []]
    if args := doc.get("args"):
        run.program = Path(str(args[0])).name
    oob = doc.get("out_of_bounds")
    if isinstance(oob, dict):
        run.out_of_bounds = int(oob.get("count", 0))
    avg = doc.get("average_bus_bandwidth")
    if isinstance(avg, dict):
        run.avg_busbw = number(str(avg.get("bandwidth")))
    run.complete = "end_time" in doc and avg is not None
    run.errors += [str(e) for e in doc.get("errors") or []]
    return run


def row_from_json(r: dict[str, Any]) -> Row:
    sides = {}
    for place in PLACES:
        s = r.get(place)
        if not isinstance(s, dict):
            continue
        wrong = s.get("nwrong")
        sides[place] = Side(number(str(s.get("time", s.get("cpu_time")))), number(str(s.get("alg_bw"))),
                            number(str(s.get("bus_bw"))), None if wrong is None else int(float(wrong)))
    return Row(int(r["size"]), int(r["count"]), str(r.get("type", "")), str(r.get("redop", "")), sides)


def parse(text: str) -> Run:
    return parse_json(text) if text.lstrip().startswith("{") else parse_text(text)


def judge(run: Run, floor: float, min_bytes: int) -> dict[str, Any]:
    reasons: list[str] = []
    status = PASS
    if not run.rows:
        status = UNKNOWN
        reasons.append("no result table in the output" + (f": {run.errors[0]}" if run.errors else ""))
    wrong = [r for r in run.rows if r.wrong()]
    if wrong:
        status = FAIL
        reasons.append("wrong results: " + ", ".join(f"{r.wrong()} at {r.size} B" for r in wrong))
    if run.out_of_bounds:
        status = FAIL
        reasons.append(f"nccl-tests counted {run.out_of_bounds} out-of-bounds results")
    if run.rows and not run.complete:
        status = FAIL
        reasons.append(f"truncated: the output stops after {run.rows[-1].size} B, before its footer"
                       + (f" ({run.errors[0][:120]})" if run.errors else ""))
    judged = [r for r in run.rows if r.size >= min_bytes and r.busbw() is not None]
    if floor > 0:
        low = [r for r in judged if (r.busbw() or 0.0) < floor]
        if low:
            status = FAIL
            reasons.append(f"bus bandwidth below {floor:g} GB/s: "
                           + ", ".join(f"{r.busbw():.2f} at {r.size} B" for r in low))
        elif run.rows and not judged and status == PASS:
            status = UNKNOWN
            reasons.append(f"no size of at least {min_bytes} B was measured")
    best = max(judged, key=lambda r: r.size) if judged else (run.rows[-1] if run.rows else None)
    return {
        "verdict": NAMES[status], "exit_code": status, "program": run.program, "source": run.source,
        "gpus": run.ngpus if run.ngpus is not None else run.ranks, "complete": run.complete,
        "floor_gbps": floor, "min_bytes": min_bytes, "reasons": reasons,
        "largest": None if best is None else {"size": best.size, "busbw": best.busbw()},
        "avg_busbw": run.avg_busbw, "out_of_bounds": run.out_of_bounds,
        "results": [{"size": r.size, "count": r.count, "type": r.type, "redop": r.redop,
                     **{p: vars(s) for p, s in r.sides.items()}} for r in run.rows],
    }


def metrics(doc: dict[str, Any]) -> str:
    coll = {"collective": doc["program"].removesuffix("_perf")}
    m = Metrics()
    m.gauge("nodeforge_nccl_bench_pass", "1 when the last NCCL benchmark passed, 0 when it failed or could not tell.",
            1 if doc["exit_code"] == PASS else 0, coll)
    m.gauge("nodeforge_nccl_bench_status", "Verdict of the last NCCL benchmark (0 PASS, 2 FAIL, 3 UNKNOWN).",
            doc["exit_code"], coll)
    busbw = "nodeforge_nccl_bench_busbw_gbytes_per_second"
    m.declare(busbw, "gauge", "Bus bandwidth per message size (GB/s).")
    for r in doc["results"]:
        for place in PLACES:
            side = r.get(place)
            if side and side["busbw"] is not None:
                m.sample(busbw, str(side["busbw"]), {**coll, "placement": place, "size": str(r["size"])})
    m.gauge("nodeforge_nccl_bench_wrong_results", "Results with wrong values in the last NCCL benchmark.",
            sum((r.get(p) or {}).get("wrong") or 0 for r in doc["results"] for p in PLACES), coll)
    m.gauge("nodeforge_nccl_bench_last_run_timestamp_seconds", "When the last NCCL benchmark was judged.",
            int(time.time()), coll)
    if doc["avg_busbw"] is not None:
        m.gauge("nodeforge_nccl_bench_avg_busbw_gbytes_per_second", "nccl-tests' average bus bandwidth.",
                str(doc["avg_busbw"]), coll)
    return m.text()


def report(doc: dict[str, Any]) -> str:
    head = f"NCCL-BENCH {doc['verdict']} - {doc['program']}, {doc['gpus']} GPUs"
    if doc["largest"]:
        head += f", busbw {doc['largest']['busbw']:.2f} GB/s at {doc['largest']['size']} B"
    if doc["floor_gbps"]:
        head += f" (floor {doc['floor_gbps']:g} GB/s from {doc['min_bytes']} B)"
    lines = [head, *(f"  {r}" for r in doc["reasons"])]
    lines.append(f"  {'size (B)':>12}  {'busbw oop':>10}  {'busbw ip':>10}  {'#wrong':>7}")
    for r in doc["results"]:
        oop, ip = r.get("out_of_place") or {}, r.get("in_place") or {}
        wrong = (oop.get("wrong") or 0) + (ip.get("wrong") or 0)
        lines.append(f"  {r['size']:>12}  {oop.get('busbw') or 0:>10.2f}  {ip.get('busbw') or 0:>10.2f}  {wrong:>7}")
    return "\n".join(lines) + "\n"


def run_benchmark(args: argparse.Namespace) -> tuple[str, str | None]:
    """(output to judge, why it could not run); JSON output preferred where the binary wrote it."""
    binary = args.binary
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        return "", (f"{binary} is not installed: nccl-tests is not packaged by Debian; build all_reduce_perf "
                    "from NVIDIA/nccl-tests and set --binary (nccl-bench.binary)")
    extra = args.bench_args or shlex.split(args.args)
    with tempfile.TemporaryDirectory(prefix="nccl-bench.") as tmp:
        json_path = Path(tmp) / "all_reduce_perf.json"
        argv = [*shlex.split(args.launcher), binary, *extra, *(["-J", str(json_path)] if args.json_output else [])]
        # No NCCL_TESTS_MIN_BW: nccl-tests compares it with its *average* bus bandwidth over every
        # size (dragged down by the latency-bound small ones) and exits non-zero on a run this
        # judge passes; the floor is judged here, per size, from --min-bytes.
        env = {k: v for k, v in os.environ.items() if k != "NCCL_TESTS_MIN_BW"}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout, env=env, check=False)
            out = proc.stdout + (proc.stderr if proc.returncode else "")
        except subprocess.TimeoutExpired as exc:
            partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return partial + f"\ntimeout: killed after {args.timeout} s\n", None
        if args.output:
            write_atomic(Path(args.output), out)
        if args.json_output and json_path.is_file() and json_path.stat().st_size:
            text = json_path.read_text(encoding="utf-8")
            if args.output:
                write_atomic(Path(args.output).with_suffix(".json"), text)
            return text, None
        return out, None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodeforge-nccl-bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("run", "parse"))
    p.add_argument("file", nargs="?", help="parse: the recorded output (- for standard input)")
    p.add_argument("--config", default="/etc/nodeforge/nccl-bench.conf")
    p.add_argument("--binary", default="/opt/nccl-tests/build/all_reduce_perf")
    p.add_argument("--args", default="-b 8 -e 8G -f 2 -g 8", help="all_reduce_perf arguments (one string)")
    p.add_argument("--launcher", default="", help="command before the binary, e.g. mpirun -np 8 ...")
    p.add_argument("--json-output", action="store_true", help="ask nccl-tests for -J JSON (2.18.5 and later)")
    p.add_argument("--floor", type=float, default=0.0, help="bus bandwidth floor in GB/s (0: not judged)")
    p.add_argument("--min-bytes", type=int, default=1 << 30, help="sizes from which the floor applies")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--output", default=None, help="run: keep the raw output here")
    p.add_argument("--json", action="store_true", help="print the JSON verdict instead of text")
    p.add_argument("--json-file", default=None)
    p.add_argument("--textfile", default=None, help="write nccl_bench.prom into this directory")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = parser()
    bench_args: list[str] = []
    if "--" in argv:  # run: everything after -- goes to all_reduce_perf
        cut = argv.index("--")
        argv, bench_args = argv[:cut], argv[cut + 1:]
    config_defaults(p, argv, "nccl-bench", reserved=("command", "file"))
    args = p.parse_args(argv)
    args.bench_args = bench_args
    if args.command == "run" and args.file is not None:
        p.error("run takes no FILE: give all_reduce_perf's arguments after --")
    if args.command == "parse" and args.file is None:
        p.error("parse needs a FILE (or -)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "parse":
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8", errors="replace")
        doc = judge(parse(text), args.floor, args.min_bytes)
    else:
        text, why = run_benchmark(args)
        if why:
            doc = judge(Run("text"), args.floor, args.min_bytes)
            doc["reasons"] = [why]
        else:
            doc = judge(parse(text), args.floor, args.min_bytes)
    return finish(doc, report, json_out=args.json, json_file=args.json_file,
                  textfile=Path(args.textfile) / "nccl_bench.prom" if args.textfile else None, metrics=metrics)

if __name__ == "__main__":
    sys.exit(main())
