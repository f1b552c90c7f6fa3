#!/usr/bin/env python3
"""nodeforge-gpu-health: the GPU fault runbook as one fast command a scheduler can use.

Rules (each named in the output, the JSON result, the metric and the drain reason):

  nvidia-smi      nvidia-smi failed, hung past its timeout, or could not reach a GPU
  gpu-count       fewer GPUs than expected
  xid             Xid events in the kernel log, judged by the Xid policy table
  nvrm            driver failures without an Xid (RmInitAdapter failed, GPU lost)
  ecc-volatile    uncorrectable ECC errors since the last driver load
  ecc-aggregate   uncorrectable ECC errors over the GPU's lifetime above a limit
  remap-pending   remapped rows waiting for a GPU reset
  remap-failure   a row remapping failed: the GPU needs service
  retired-pages   pages pending retirement, or more retired pages than the limit (pre-Ampere)
  pcie-gen        PCIe link generation below expected (not judged while the GPU idles)
  pcie-width      PCIe link width below expected
  persistence     persistence mode off
  fabric          NVSwitch fabric registration not Completed/Success
  throttle        clock throttle reasons from the configured set are active
  memtest         the configured memory test failed (only with --memtest; epilog use)

Slurm contract: Slurm ignores HealthCheckProgram's exit status and kills it after 60 s, so
this program drains the node itself (scontrol update ... State=DRAIN Reason="gpu-health:
<rule>: <detail>"), resumes only a node whose drain reason carries its own prefix, asks
nvidia-smi once per kind of data (never once per GPU), gives every command a timeout, and
stops asking once its deadline is spent. It never sleeps.

The kernel log comes from `dmesg` (--dmesg-command), or a file (--kernel-log); the journal works
too: --dmesg-command "journalctl -k -b -o short-monotonic --no-pager" prints the same
[seconds since boot] stamps that --xid-window-seconds reads.

Exit status (Nagios): 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "gpu-health:"
OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATUS_NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}

# in the order a drain reason names them: the most specific cause first
RULES = ("xid", "nvrm", "nvidia-smi", "gpu-count", "remap-failure", "ecc-volatile", "remap-pending",
         "retired-pages", "fabric", "memtest", "pcie-width", "pcie-gen", "persistence", "ecc-aggregate",
         "throttle")

QUERY_FIELDS = ("index", "pci.bus_id", "name", "persistence_mode", "pcie.link.gen.current", "pcie.link.gen.max",
                "pcie.link.width.current", "pcie.link.width.max", "ecc.mode.current",
                "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
                "retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count", "retired_pages.pending",
                "remapped_rows.pending", "remapped_rows.failure", "clocks_throttle_reasons.active")

# NVML clocks event (throttle) reason bits, as nvidia-smi names the matching query fields
THROTTLE_BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
                 "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
                 "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100}

# nvidia-smi exit codes are NVML return codes
NVML_CODES = {2: "invalid argument", 3: "not supported", 4: "no permission", 6: "not found",
              8: "insufficient power", 9: "driver not loaded", 10: "timeout", 11: "interrupt issue",
              12: "NVML library not found", 13: "function not found", 14: "corrupted infoROM",
              15: "GPU is lost", 16: "GPU needs reset", 17: "operating system call failed",
              999: "unknown error"}

XID_ACTIONS = ("drain", "reset", "warn", "ignore")
NVRM_PATTERNS = (
    re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^:]*:"
               r"\s*(?P<what>RmInitAdapter failed!?.*)"),
    re.compile(r"NVRM: (?P<what>GPU (?:at )?(?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
               r"\S* (?:GPU )?has fallen off the bus.*)"),
)
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]*\): "
                      r"(?P<code>\d+),\s*(?P<text>.*)")
DMESG_TIME = re.compile(r"^\[\s*(?P<t>\d+\.\d+)\]")
NA = {"", "[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]",
      "[Requested functionality has been deprecated]"}


@dataclass
class Finding:
    rule: str
    severity: int
    detail: str
    gpu: str | None = None
    action: str = "drain"  # drain, reset (drain, and reset when asked), none

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = STATUS_NAMES[self.severity]
        return d


@dataclass
class Gpu:
    index: int
    bus_id: str
    name: str
    values: dict[str, str | None]

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.bus_id})"


@dataclass
class Result:
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gpus: list[Gpu] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    ignored_xids: list[dict[str, Any]] = field(default_factory=list)
    slurm: dict[str, Any] = field(default_factory=dict)
    resets: list[dict[str, Any]] = field(default_factory=list)

    def status(self) -> int:
        severities = {f.severity for f in self.findings}
        if CRITICAL in severities:
            return CRITICAL
        if self.unknown:
            return UNKNOWN
        return WARNING if WARNING in severities else OK


class Runner:
    """Runs external commands under one deadline; every call gets a timeout."""

    def __init__(self, command_timeout: float, deadline: float) -> None:
        self.command_timeout = command_timeout
        self.end = time.monotonic() + deadline

    def run(self, argv: list[str], timeout: float | None = None) -> tuple[int | None, str, str]:
        """(exit status or None on timeout, stdout, stderr); exit 127 when the program is missing."""
        left = self.end - time.monotonic()
        limit = min(timeout if timeout is not None else self.command_timeout, left)
        if limit <= 0:
            return None, "", "deadline spent before the command started"
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit, check=False)
        except FileNotFoundError:
            return 127, "", f"{argv[0]}: not found"
        except PermissionError as exc:
            return 126, "", str(exc)
        except subprocess.TimeoutExpired:
            return None, "", f"no answer within {limit:.0f} s"
        return proc.returncode, proc.stdout, proc.stderr


def bus_key(text: str) -> str:
    """'00000000:3B:00.0', '0000:3b:00' and 'PCI:0000:3b:00' all become '0000:3b:00'."""
    m = re.search(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})", text)
    if not m:
        return text.lower()
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}"


def value(v: str | None) -> str | None:
    if v is None:
        return None
    v = v.strip()
    return None if v in NA else v


def as_int(v: str | None) -> int | None:
    v = value(v)
    if v is None:
        return None
    m = re.match(r"(0x[0-9a-fA-F]+|-?\d+)", v)
    if not m:
        return None
    return int(m.group(1), 0)


def parse_csv(text: str, fields: tuple[str, ...]) -> tuple[list[dict[str, str | None]], list[str]]:
    """Rows of an nvidia-smi --format=csv answer by column name (units stripped from the header), and
    the lines that are not rows (nvidia-smi prints per-GPU errors among them)."""
    rows: list[dict[str, str | None]] = []
    other: list[str] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if header is None and cells and cells[0].split(" [")[0] == fields[0]:
            header = [re.sub(r"\s*\[[^\]]*\]$", "", c) for c in cells]
            missing = [f for f in fields if f not in header]
            if missing:
                other.append(f"answer lacks the columns {', '.join(missing)}")
            continue
        if header is not None and len(cells) == len(header):
            rows.append({name: value(cell) for name, cell in zip(header, cells, strict=True)})
        else:
            other.append(line.strip())
    return rows, other


def load_policy(path: Path, overrides: dict[str, list[int]]) -> dict[int, tuple[str, str]]:
    """code -> (action, description), from the policy table and then the per-action overrides."""
    policy: dict[int, tuple[str, str]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 3 or not parts[0].strip().isdigit() or parts[1].strip() not in XID_ACTIONS:
            raise ValueError(f"{path}:{number}: expected 'code<TAB>action<TAB>description' with action one of "
                             f"{', '.join(XID_ACTIONS)}, found {line!r}")
        policy[int(parts[0])] = (parts[1].strip(), parts[2].strip())
    for action, codes in overrides.items():
        for code in codes:
            policy[code] = (action, policy.get(code, (action, "set by site policy"))[1])
    return policy


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.runner = Runner(args.command_timeout, args.deadline)
        self.result = Result()
        self.warn_rules = set(args.warn_rules)
        self.skip_rules = set(args.skip_rules)

    # -- helpers ---------------------------------------------------------------------------------
    def add(self, rule: str, detail: str, gpu: Gpu | None = None, action: str = "drain",
            severity: int = CRITICAL) -> None:
        if rule in self.skip_rules:
            return
        if severity == CRITICAL and rule in self.warn_rules:
            severity, action = WARNING, "none"
        if severity == WARNING:
            action = "none"
        self.result.findings.append(Finding(rule, severity, detail, gpu.label if gpu else None, action))

    def smi(self, *argv: str) -> tuple[int | None, str, str]:
        return self.runner.run([self.args.nvidia_smi, *argv])

    # -- data sources ----------------------------------------------------------------------------
    def query_gpus(self) -> bool:
        fields = ",".join(QUERY_FIELDS)
        code, out, err = self.smi(f"--query-gpu={fields}", "--format=csv")
        if code is None:
            self.add("nvidia-smi", f"nvidia-smi gave no answer: {err} (a GPU in a bad state can hang it)")
            return False
        if code == 127:
            self.result.unknown.append(f"nvidia-smi not found ({self.args.nvidia_smi})")
            return False
        rows, other = parse_csv(out, QUERY_FIELDS)
        if code == 2 or any(o.startswith("answer lacks") for o in other) or "is not a valid field" in out + err:
            self.result.unknown.append(f"nvidia-smi rejected the query (exit {code}): "
                                       f"{(err or out).strip().splitlines()[-1:] or ''}")
            return False
        if code != 0:
            meaning = NVML_CODES.get(code, "error")
            said = "; ".join(line.strip() for line in (other + err.splitlines()) if line.strip())[:160]
            self.add("nvidia-smi", f"nvidia-smi exit {code} ({meaning}){': ' + said if said else ''}")
        for row in rows:
            index = as_int(row.get("index"))
            if index is None:
                continue
            self.result.gpus.append(Gpu(index, row.get("pci.bus_id") or "?", row.get("name") or "?", row))
        return bool(rows)

    def kernel_log(self) -> str | None:
        if self.args.kernel_log:
            try:
                return Path(self.args.kernel_log).read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                self.result.unknown.append(f"kernel log {self.args.kernel_log}: {exc.strerror}")
                return None
        code, out, err = self.runner.run(shlex.split(self.args.dmesg_command))
        if code != 0:
            self.result.unknown.append(f"kernel log: {self.args.dmesg_command} failed: "
                                       f"{err.strip() or f'exit {code}'}")
            return None
        return out

    def uptime(self) -> float | None:
        try:
            return float((Path(self.args.proc_root) / "uptime").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    # -- rules -----------------------------------------------------------------------------------
    def rule_count(self) -> None:
        expected = self.args.expected_gpus
        if expected and len(self.result.gpus) < expected:
            seen = ", ".join(g.bus_id for g in self.result.gpus) or "none"
            self.add("gpu-count", f"{len(self.result.gpus)} of {expected} GPUs visible (seen: {seen})")

    def rule_kernel_log(self) -> None:
        if {"xid", "nvrm"} <= self.skip_rules:
            return
        text = self.kernel_log()
        if text is None:
            return
        policy = load_policy(Path(self.args.xid_policy), {
            "drain": self.args.xid_drain, "reset": self.args.xid_reset,
            "warn": self.args.xid_warn, "ignore": self.args.xid_ignore})
        window = self.args.xid_window_seconds
        now = self.uptime() if window else None
        by_bus = {bus_key(g.bus_id): g for g in self.result.gpus}
        seen: dict[tuple[str, int], tuple[int, str]] = {}
        nvrm: dict[str, str] = {}
        for line in text.splitlines():
            if window and now is not None:
                t = DMESG_TIME.match(line)
                if t and now - float(t.group("t")) > window:
                    continue
            m = XID_LINE.search(line)
            if m:
                key = (bus_key(m.group("bus")), int(m.group("code")))
                count, _ = seen.get(key, (0, ""))
                seen[key] = (count + 1, m.group("text").strip())
                continue
            for pattern in NVRM_PATTERNS:
                n = pattern.search(line)
                if n:
                    nvrm.setdefault(bus_key(n.group("bus")), n.group("what").strip())
        for (bus, code), (count, text_) in sorted(seen.items()):
            action, name = policy.get(code, (self.args.xid_unknown, "not in the policy table"))
            gpu = by_bus.get(bus)
            where = gpu.label if gpu else f"GPU {bus}"
            detail = f"{where} Xid {code} x{count} ({name}): {text_[:80]}"
            if action == "ignore":
                self.result.ignored_xids.append({"gpu": where, "xid": code, "count": count, "meaning": name})
            elif action == "warn":
                self.add("xid", detail, gpu, severity=WARNING)
            else:
                self.add("xid", detail, gpu, action=action)
        judged = {bus for (bus, code) in seen if policy.get(code, (self.args.xid_unknown, ""))[0]
                  in ("drain", "reset")}
        for bus, what in sorted(nvrm.items()):
            if bus in judged:  # the same event, already named by its Xid
                continue
            gpu = by_bus.get(bus)
            self.add("nvrm", f"{gpu.label if gpu else 'GPU ' + bus}: {what[:100]}", gpu)

    def rule_per_gpu(self) -> None:
        a = self.args
        for g in self.result.gpus:
            v = g.values
            volatile = as_int(v.get("ecc.errors.uncorrected.volatile.total"))
            if volatile:
                self.add("ecc-volatile", f"{g.label}: {volatile} uncorrectable ECC errors since the driver loaded",
                         g, action="reset")
            aggregate = as_int(v.get("ecc.errors.uncorrected.aggregate.total"))
            if aggregate is not None and aggregate > a.ecc_aggregate_max:
                self.add("ecc-aggregate", f"{g.label}: {aggregate} uncorrectable ECC errors in its lifetime "
                         f"(limit {a.ecc_aggregate_max})", g)
            if v.get("remapped_rows.failure") == "Yes":
                self.add("remap-failure", f"{g.label}: row remapping failed; the GPU needs service", g)
            if v.get("remapped_rows.pending") == "Yes":
                self.add("remap-pending", f"{g.label}: remapped rows pending; a GPU reset activates them",
                         g, action="reset")
            sbe = as_int(v.get("retired_pages.single_bit_ecc.count")) or 0
            dbe = as_int(v.get("retired_pages.double_bit.count")) or 0
            if v.get("retired_pages.pending") == "Yes":
                self.add("retired-pages", f"{g.label}: page retirement pending; a GPU reset retires them",
                         g, action="reset")
            elif sbe + dbe >= a.retired_pages_max:
                self.add("retired-pages", f"{g.label}: {sbe + dbe} retired pages (limit {a.retired_pages_max})", g)
            reasons = as_int(v.get("clocks_throttle_reasons.active"))
            idle = reasons is not None and bool(reasons & THROTTLE_BITS["gpu_idle"])
            self.rule_pcie(g, idle)
            if v.get("persistence_mode") == "Disabled":
                self.add("persistence", f"{g.label}: persistence mode off (is nvidia-persistenced running?)", g)
            if reasons:
                active = [n for n in a.throttle_reasons if reasons & THROTTLE_BITS[n]]
                if active:
                    self.add("throttle", f"{g.label}: clocks held down by {', '.join(active)} "
                             f"(0x{reasons:016X})", g)

    def rule_pcie(self, g: Gpu, idle: bool) -> None:
        v = g.values
        gen, gen_max = as_int(v.get("pcie.link.gen.current")), as_int(v.get("pcie.link.gen.max"))
        width, width_max = as_int(v.get("pcie.link.width.current")), as_int(v.get("pcie.link.width.max"))
        want_gen = self.args.pcie_gen_min or gen_max
        want_width = self.args.pcie_width_min or width_max
        if gen is not None and want_gen and gen < want_gen:
            if idle:
                self.result.notes.append(f"{g.label}: PCIe Gen{gen} while idle (idle GPUs train down): not judged")
            else:
                self.add("pcie-gen", f"{g.label}: PCIe link Gen{gen}, expected Gen{want_gen}", g)
        if width is not None and want_width and width < want_width:
            self.add("pcie-width", f"{g.label}: PCIe link x{width}, expected x{want_width}", g)

    def rule_fabric(self) -> None:
        mode = self.args.fabric
        if mode == "skip" or "fabric" in self.skip_rules or not self.result.gpus:
            return
        if mode == "auto":
            devices = Path(self.args.proc_root) / "driver/nvidia-nvswitch/devices"
            if not (devices.is_dir() and any(devices.iterdir())):
                return
        code, out, err = self.smi("-q")
        if code is None or code == 127:
            self.add("fabric", f"nvidia-smi -q gave no answer: {err}")
            return
        state: dict[str, dict[str, str]] = {}
        bus, in_fabric = "", False
        for line in out.splitlines():
            g = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$", line)
            if g:
                bus, in_fabric = bus_key(g.group(1)), False
                continue
            section = re.match(r"^    (\S.*?)\s*(?::\s*(.*))?$", line)
            if section:
                in_fabric = section.group(1) == "Fabric" and not section.group(2)
                continue
            kv = re.match(r"^        (State|Status)\s*:\s*(.*)$", line)
            if in_fabric and kv and bus:
                state.setdefault(bus, {})[kv.group(1)] = kv.group(2).strip()
        for gpu in self.result.gpus:
            s = state.get(bus_key(gpu.bus_id), {})
            st, status = s.get("State", "N/A"), s.get("Status", "N/A")
            if st == "N/A":
                self.result.notes.append(f"{gpu.label}: fabric state not reported (N/A): not judged")
            elif st != "Completed" or status not in ("Success", "N/A"):
                self.add("fabric", f"{gpu.label}: fabric state {st}, status {status} "
                         "(is nvidia-fabricmanager running, at the driver's version?)", gpu)

    def rule_memtest(self) -> None:
        if not self.args.memtest or "memtest" in self.skip_rules:
            return
        argv = shlex.split(self.args.memtest_command)
        if not argv or shutil.which(argv[0]) is None:
            self.result.notes.append(f"memtest: {argv[0] if argv else '(none)'} is not installed: skipped")
            return
        code, out, err = self.runner.run(argv, timeout=self.args.memtest_timeout)
        if code is None:
            self.add("memtest", f"{self.args.memtest_command}: did not finish: {err}")
        elif code != 0:
            tail = [line.strip(" |") for line in (out + err).splitlines() if re.search(r"fail|error", line, re.I)]
            self.add("memtest", f"{self.args.memtest_command}: exit {code}{': ' + tail[0][:100] if tail else ''}")

    # -- actions ---------------------------------------------------------------------------------
    def reset_gpus(self) -> None:
        wanted = {f.gpu for f in self.result.findings if f.action == "reset" and f.gpu}
        if not self.args.reset or not wanted:
            return
        code, out, err = self.smi("--query-compute-apps=gpu_bus_id,pid,process_name", "--format=csv,noheader")
        if code != 0:
            for label in sorted(wanted):
                self.result.resets.append({"gpu": label, "done": False,
                                           "why": f"could not list GPU processes: {err.strip() or code}"})
            return
        busy: dict[str, list[str]] = {}
        for line in out.splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) >= 2 and cells[1].isdigit():
                busy.setdefault(bus_key(cells[0]), []).append(cells[1])
        for gpu in self.result.gpus:
            if gpu.label not in wanted:
                continue
            pids = busy.get(bus_key(gpu.bus_id))
            if pids:
                self.result.resets.append({"gpu": gpu.label, "done": False,
                                           "why": f"refused: in use by pid {', '.join(pids)}"})
                continue
            rc, rout, rerr = self.smi("-r", "-i", str(gpu.index))
            said = (rout + rerr).strip().splitlines()
            self.result.resets.append({"gpu": gpu.label, "done": rc == 0,
                                       "why": said[-1] if said else f"exit {rc}"})

    def slurm(self) -> None:
        mode = self.args.drain
        scontrol = self.args.scontrol
        if mode == "no" or (mode == "auto" and shutil.which(scontrol) is None):
            self.result.slurm = {"action": "none", "why": "draining off" if mode == "no" else "no scontrol"}
            return
        node = self.args.node or socket.gethostname().split(".")[0]
        status = self.result.status()
        code, out, err = self.runner.run([scontrol, "show", "node", node])
        state, reason = "", ""
        if code == 0:
            m = re.search(r"\bState=(\S+)", out)
            state = m.group(1) if m else ""
            r = re.search(r"^\s*Reason=(.*?)(?:\s+\[[^\]]*\])?\s*$", out, re.M)
            reason = r.group(1) if r else ""
        drained = "DRAIN" in state.upper()
        ours = reason.startswith(PREFIX)
        info: dict[str, Any] = {"node": node, "state": state, "reason": reason}
        if status == CRITICAL:
            first = min((f for f in self.result.findings if f.severity == CRITICAL),
                        key=lambda f: RULES.index(f.rule))
            more = sum(1 for f in self.result.findings if f.severity == CRITICAL) - 1
            text = f"{PREFIX} {first.rule}: {first.detail}" + (f" (+{more} more)" if more else "")
            text = re.sub(r"\s+", " ", text)[:250]
            if drained and not ours:
                info.update(action="none", why="already drained for another reason: left as it is")
            elif drained and reason == text:
                info.update(action="none", why="already drained by gpu-health for this reason")
            else:
                rc, _, uerr = self.runner.run([scontrol, "update", f"NodeName={node}", "State=DRAIN",
                                               f"Reason={text}"])
                info.update(action="drain", sent=text, ok=rc == 0, error=uerr.strip() if rc else "")
        elif status in (OK, WARNING) and drained and ours:
            rc, _, uerr = self.runner.run([scontrol, "update", f"NodeName={node}", "State=RESUME"])
            info.update(action="resume", ok=rc == 0, error=uerr.strip() if rc else "")
        else:
            info.update(action="none")
        if code != 0:
            info["show_error"] = (err.strip() or f"exit {code}")[:200]
        self.result.slurm = info

    # -- run -------------------------------------------------------------------------------------
    def run(self) -> Result:
        have_gpus = self.query_gpus()
        if have_gpus or not self.result.unknown:
            self.rule_count()
        self.rule_kernel_log()
        self.rule_per_gpu()
        if have_gpus:
            self.rule_fabric()
        self.rule_memtest()
        self.slurm()
        self.reset_gpus()
        return self.result


# -- output -------------------------------------------------------------------------------------
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
    lines = [
        "# HELP nodeforge_gpu_health_status Result of the last GPU health check (0 OK, 1 WARNING, 2 CRITICAL, "
        "3 UNKNOWN).",
        "# TYPE nodeforge_gpu_health_status gauge",
        f"nodeforge_gpu_health_status {doc['exit_code']}",
        "# HELP nodeforge_gpu_health_rule_status Result of one rule (0 OK, 1 WARNING, 2 CRITICAL).",
        "# TYPE nodeforge_gpu_health_rule_status gauge",
        *(f'nodeforge_gpu_health_rule_status{{rule="{r}"}} {worst.get(r, 0)}' for r in RULES),
        "# HELP nodeforge_gpu_health_gpus GPUs nvidia-smi reported.",
        "# TYPE nodeforge_gpu_health_gpus gauge",
        f"nodeforge_gpu_health_gpus {doc['gpus']}",
        "# HELP nodeforge_gpu_health_duration_seconds How long the last check took.",
        "# TYPE nodeforge_gpu_health_duration_seconds gauge",
        f"nodeforge_gpu_health_duration_seconds {doc['duration_seconds']}",
        "# HELP nodeforge_gpu_health_last_run_timestamp_seconds When the last check finished.",
        "# TYPE nodeforge_gpu_health_last_run_timestamp_seconds gauge",
        f"nodeforge_gpu_health_last_run_timestamp_seconds {int(time.time())}",
    ]
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(0o644)
    tmp.replace(path)


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
    p.add_argument("--xid-policy", default="/usr/share/nodeforge/gpu-health/xid-policy.tsv")
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
    p.add_argument("--memtest-command", default="dcgmi diag -r memory")
    p.add_argument("--memtest-timeout", type=int, default=600)
    p.add_argument("--reset", action="store_true", help="reset GPUs that need it when no process uses them")
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
    pre, _ = p.parse_known_args(argv)
    config = configparser.ConfigParser(interpolation=None)
    if pre.config and Path(pre.config).is_file():
        config.read(pre.config, encoding="utf-8")
    if config.has_section("gpu-health"):
        known = {a.dest: a for a in p._actions}
        defaults: dict[str, Any] = {}
        for key, raw in config.items("gpu-health"):
            dest = key.replace("-", "_")
            if dest not in known:
                p.error(f"{pre.config}: unknown option {key!r}")
            action = known[dest]
            if isinstance(action, argparse._StoreTrueAction):
                defaults[dest] = raw.strip().lower() in ("1", "yes", "true", "on")
            elif action.type is not None and callable(action.type):
                defaults[dest] = action.type(raw)
            else:
                defaults[dest] = raw.strip() or None
        p.set_defaults(**defaults)
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
    if args.json_file:
        write_atomic(Path(args.json_file), json.dumps(doc, indent=2) + "\n")
    if args.textfile:
        write_atomic(Path(args.textfile) / "gpu_health.prom", metrics(doc))
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if args.json else text_report(doc))
    return int(doc["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
