#!/usr/bin/env python3
"""nodeforge-gpu-health: the GPU fault runbook as one fast command a scheduler can use.

Rules (each named in the output, the JSON result, the metric and the drain reason):

  nvidia-smi      nvidia-smi failed, hung past its timeout, or could not reach a GPU
  gpu-count       fewer GPUs than expected
  xid             Xid events in the kernel log since the GPU's last successful reset, judged by the
                  node's Xid policy table (/usr/share/nodeforge/xid-policy.tsv, layer node-lib)
  nvrm            driver failures without an Xid (RmInitAdapter failed, GPU lost)
  ecc-volatile    uncorrectable ECC errors since the last driver load
  ecc-aggregate   uncorrectable ECC errors over the GPU's lifetime above a limit
  remap-pending   remapped rows waiting for a GPU reset
  remap-failure   a row remapping failed: the GPU needs service
  retired-pages   pages pending retirement, or more retired pages than the limit (pre-Ampere)
  pcie-gen        PCIe link generation below expected (not judged while the GPU idles)
  pcie-width      PCIe link width below expected
  persistence     persistence mode off (a warning: slow job starts, not a fault)
  fabric          NVSwitch fabric registration not Completed/Success (--query-gpu=fabric.*, or
                  -q -i N per GPU on drivers without those fields; no answer is UNKNOWN)
  throttle        clock throttle reasons from the configured set are active
  memtest         the configured memory test failed (only with --memtest: the epilog after a
                  failed job, or the idle timer with --memtest-if-idle)

Slurm contract: Slurm ignores HealthCheckProgram's exit status and kills it after 60 s, so
this program drains the node itself (scontrol update ... State=DRAIN Reason="gpu-health:
<rule>: <detail>"), resumes only a node whose drain reason carries its own prefix, asks
nvidia-smi once per kind of data (never once per GPU), gives every command a timeout, and
stops asking once its deadline is spent. It never sleeps. A reset (--reset) stops the units that hold
the GPUs (nvidia-dcgm, nodeforge-dcgm-exporter) around it and starts them again whatever it did, and a
successful one is recorded in --state-dir (last-reset-<bus>: boot id and seconds since boot), so the
Xids it dealt with no longer count and the node resumes.

The kernel log comes from `dmesg` (--dmesg-command), or a file (--kernel-log); the journal works
too: --dmesg-command "journalctl -k -b -o short-monotonic --no-pager" prints the same
[seconds since boot] stamps that --xid-window-seconds reads.

Exit status (Nagios): 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from nodeforge_gpu_health import RULES, STATUS_NAMES, THROTTLE_BITS, UNKNOWN, Result
from nodeforge_gpu_health_check import Check
from nodeforge_node import XID_ACTIONS, XID_POLICY, Metrics, config_defaults, finish

__all__ = ["RULES", "main"]


def summary(result: Result, started: float) -> dict[str, Any]:
    status = result.status()
    findings = sorted(result.findings, key=lambda f: (-f.severity, RULES.index(f.rule)))
    return {
        "status": STATUS_NAMES[status], "exit_code": status, "gpus": len(result.gpus),
        "failed_rules": sorted({f.rule for f in findings}, key=RULES.index),
        "findings": [f.as_dict() for f in findings], "unknown": result.unknown, "notes": result.notes,
        "ignored_xids": result.ignored_xids, "slurm": result.slurm, "resets": result.resets,
        "duration_seconds": round(time.monotonic() - started, 3),
    }


def metrics(doc: dict[str, Any]) -> str:
    worst: dict[str, int] = {}
    for f in doc["findings"]:
        code = {v: k for k, v in STATUS_NAMES.items()}[f["severity"]]
        worst[f["rule"]] = max(worst.get(f["rule"], 0), code)
    m = Metrics()
    m.gauge("nodeforge_gpu_health_status",
            "Result of the last GPU health check (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN).", doc["exit_code"])
    for r in RULES:
        m.gauge("nodeforge_gpu_health_rule_status", "Result of one rule (0 OK, 1 WARNING, 2 CRITICAL).",
                worst.get(r, 0), {"rule": r})
    m.gauge("nodeforge_gpu_health_gpus", "GPUs nvidia-smi reported.", doc["gpus"])
    m.gauge("nodeforge_gpu_health_duration_seconds", "How long the last check took.", str(doc["duration_seconds"]))
    m.gauge("nodeforge_gpu_health_last_run_timestamp_seconds", "When the last check finished.", int(time.time()))
    return m.text()


def text_report(doc: dict[str, Any]) -> str:
    head = f"GPU-HEALTH {doc['status']}"
    if doc["findings"]:
        head += " - " + "; ".join(f"{f['rule']}: {f['detail']}" for f in doc["findings"][:3])
    elif doc["unknown"]:
        head += " - " + "; ".join(doc["unknown"])
    else:
        head += f" - {doc['gpus']} GPUs, no rule fired"
    lines = [f"{head} | status={doc['exit_code']} gpus={doc['gpus']}"]
    lines += [f"{f['severity']} {f['rule']}: {f['detail']}" for f in doc["findings"]]
    lines += [f"UNKNOWN {u}" for u in doc["unknown"]]
    lines += [f"note: {n}" for n in doc["notes"]]
    lines += [f"ignored Xid {x['xid']} on {x['gpu']} x{x['count']} ({x['meaning']})" for x in doc["ignored_xids"]]
    slurm = doc["slurm"]
    if slurm.get("action") in ("drain", "resume"):
        lines.append(f"slurm: {slurm['action']} {slurm.get('node')}: {'ok' if slurm.get('ok') else 'FAILED'}"
                     f"{' ' + slurm['sent'] if slurm.get('sent') else ''}")
    elif slurm.get("why"):
        lines.append(f"slurm: {slurm['why']}")
    lines += [f"reset {r['gpu']}: {'done' if r['done'] else 'not done'}: {r['why']}" for r in doc["resets"]]
    return "\n".join(lines) + "\n"


# -- command line -------------------------------------------------------------------------------
def int_list(text: str) -> list[int]:
    return [int(x) for x in re.split(r"[,\s]+", text.strip()) if x]


def name_list(text: str) -> list[str]:
    return [x for x in re.split(r"[,\s]+", text.strip()) if x]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodeforge-gpu-health", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="/etc/nodeforge/gpu-health.conf",
                   help="INI file with a [gpu-health] section of option=value (options given here win)")
    p.add_argument("--nvidia-smi", default="nvidia-smi")
    p.add_argument("--scontrol", default="scontrol")
    p.add_argument("--dmesg-command", default="dmesg", help="command printing the kernel log")
    p.add_argument("--kernel-log", default=None, help="read the kernel log from this file instead")
    p.add_argument("--proc-root", default="/proc")
    p.add_argument("--xid-policy", default=XID_POLICY, help="the node's Xid policy table (layer node-lib)")
    for action in XID_ACTIONS:
        p.add_argument(f"--xid-{action}", type=int_list, default=[], help=f"Xid codes to {action} (over the table)")
    p.add_argument("--xid-unknown", choices=("drain", "reset", "warn", "ignore"), default="warn")
    p.add_argument("--xid-window-seconds", type=int, default=0, help="only Xids this recent count (0: since boot)")
    p.add_argument("--expected-gpus", type=int, default=0, help="0: not checked")
    p.add_argument("--pcie-gen-min", type=int, default=0, help="0: the max nvidia-smi reports")
    p.add_argument("--pcie-width-min", type=int, default=0, help="0: the max nvidia-smi reports")
    p.add_argument("--ecc-aggregate-max", type=int, default=0)
    p.add_argument("--retired-pages-max", type=int, default=60)
    p.add_argument("--throttle-reasons", type=name_list,
                   default=["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"])
    p.add_argument("--warn-rules", type=name_list, default=["ecc-aggregate", "throttle"],
                   help="rules that warn instead of failing (no drain)")
    p.add_argument("--skip-rules", type=name_list, default=[])
    p.add_argument("--fabric", choices=("auto", "check", "skip"), default="auto",
                   help="auto: check when /proc/driver/nvidia-nvswitch/devices lists NVSwitches")
    p.add_argument("--memtest", action="store_true", help="run the memory test (slow: for an epilog)")
    p.add_argument("--memtest-if-idle", action="store_true",
                   help="with --memtest: only when no process uses a GPU (the idle timer)")
    p.add_argument("--memtest-command", default="dcgmi diag -r memory")
    p.add_argument("--memtest-timeout", type=int, default=600)
    p.add_argument("--reset", action="store_true", help="reset GPUs that need it when no process uses them")
    p.add_argument("--reset-stop-units", type=name_list,
                   default=["nvidia-dcgm.service", "nodeforge-dcgm-exporter.service"],
                   help="units stopped around a reset (they hold the GPUs) and started again after it")
    p.add_argument("--systemctl", default="systemctl")
    p.add_argument("--state-dir", default="/var/lib/nodeforge/gpu-health",
                   help="where a successful reset is recorded: Xids logged before it no longer count")
    p.add_argument("--drain", choices=("auto", "yes", "no"), default="auto",
                   help="drain/resume the Slurm node (auto: when scontrol is installed)")
    p.add_argument("--node", default=None, help="Slurm node name (default: hostname -s)")
    p.add_argument("--json", action="store_true", help="print the JSON result instead of text")
    p.add_argument("--json-file", default=None, help="also write the JSON result here")
    p.add_argument("--textfile", default=None, help="write gpu_health.prom into this textfile-collector directory")
    p.add_argument("--command-timeout", type=float, default=10.0)
    p.add_argument("--deadline", type=float, default=45.0, help="seconds for all commands together")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = parser()
    config_defaults(p, argv, "gpu-health")
    args = p.parse_args(argv)
    for name in (*args.warn_rules, *args.skip_rules):
        if name not in RULES:
            p.error(f"unknown rule {name!r}: rules are {', '.join(RULES)}")
    for name in args.throttle_reasons:
        if name not in THROTTLE_BITS:
            p.error(f"unknown throttle reason {name!r}: one of {', '.join(THROTTLE_BITS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = Check(args).run()
    except ValueError as exc:  # a malformed policy table
        print(f"GPU-HEALTH UNKNOWN - {exc}")
        return UNKNOWN
    doc = summary(result, started)
    return finish(doc, text_report, json_out=args.json, json_file=args.json_file,
                  textfile=Path(args.textfile) / "gpu_health.prom" if args.textfile else None, metrics=metrics)


if __name__ == "__main__":
    sys.exit(main())
