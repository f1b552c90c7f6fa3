"""nodeforge-gpu-health's rules and actions: one Check asks nvidia-smi, the kernel log and Slurm once
each, judges every rule, then drains or resumes the node and resets GPUs where asked."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import socket
from pathlib import Path
from typing import Any

from nodeforge_gpu_health import (
    CRITICAL,
    DMESG_TIME,
    FABRIC_FIELDS,
    NVML_CODES,
    NVRM_PATTERNS,
    OK,
    PREFIX,
    QUERY_FIELDS,
    RULES,
    THROTTLE_BITS,
    WARNING,
    XID_LINE,
    Finding,
    Gpu,
    Result,
    Runner,
    as_int,
    bus_key,
    fabric_from_q,
    line_bus,
    load_policy,
    mark_reset,
    reset_marks,
)
from nodeforge_node import parse_csv_with_header


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
        rows, other = parse_csv_with_header(out, QUERY_FIELDS)
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
        marks = reset_marks(self.args.state_dir, self.args.proc_root)
        before_reset: dict[str, int] = {}
        for line in text.splitlines():
            t = DMESG_TIME.match(line)
            if window and now is not None and t and now - float(t.group("t")) > window:
                continue
            m = XID_LINE.search(line)
            bus = line_bus(line, m)
            if t and bus in marks and float(t.group("t")) <= marks[bus]:
                before_reset[bus] = before_reset.get(bus, 0) + 1  # the reset already dealt with it
                continue
            if m:
                key = (bus_key(m.group("bus")), int(m.group("code")))
                count, _ = seen.get(key, (0, ""))
                seen[key] = (count + 1, m.group("text").strip())
                continue
            for pattern in NVRM_PATTERNS:
                n = pattern.search(line)
                if n:
                    nvrm.setdefault(bus_key(n.group("bus")), n.group("what").strip())
        for bus, count in sorted(before_reset.items()):
            gpu = by_bus.get(bus)
            self.result.notes.append(f"{gpu.label if gpu else 'GPU ' + bus}: {count} driver events before its last "
                                     f"reset (at {marks[bus]:.0f} s after boot): not counted")
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
                self.add("persistence", f"{g.label}: persistence mode off (is nvidia-persistenced running?): slow "
                         "job starts, not a fault", g, severity=WARNING)
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
        state = self.fabric_states()
        if state is None:
            return
        for gpu in self.result.gpus:
            s = state.get(bus_key(gpu.bus_id), {})
            st, status = s.get("State", "N/A"), s.get("Status", "N/A")
            if st == "N/A":
                self.result.notes.append(f"{gpu.label}: fabric state not reported (N/A): not judged")
            elif st != "Completed" or status not in ("Success", "N/A"):
                self.add("fabric", f"{gpu.label}: fabric state {st}, status {status} "
                         "(is nvidia-fabricmanager running, at the driver's version?)", gpu)

    def fabric_states(self) -> dict[str, dict[str, str]] | None:
        """bus -> {State, Status}: one --query-gpu on drivers 550 and later, `-q -i N` per GPU where the
        driver lacks the fields (the 535 branch), never a full -q of every GPU. A query that hangs or
        fails says UNKNOWN (None): the fabric was not read, which is not a fabric fault."""
        code, out, err = self.smi(f"--query-gpu={','.join(FABRIC_FIELDS)}", "--format=csv")
        if code == 0:
            rows, _ = parse_csv_with_header(out, FABRIC_FIELDS)
            if rows:
                return {bus_key(r.get("pci.bus_id") or ""): {"State": r.get("fabric.state") or "N/A",
                                                             "Status": r.get("fabric.status") or "N/A"} for r in rows}
        if code is not None and code != 127 and (code == 2 or "is not a valid field" in out + err):
            state: dict[str, dict[str, str]] = {}
            for gpu in self.result.gpus:
                qcode, qout, qerr = self.smi("-q", "-i", str(gpu.index))
                if qcode != 0:
                    self.result.unknown.append(f"fabric: nvidia-smi -q -i {gpu.index} gave no answer: "
                                               f"{qerr.strip() or qcode}")
                    return None
                state.update(fabric_from_q(qout))
            return state
        self.result.unknown.append(f"fabric: nvidia-smi --query-gpu={','.join(FABRIC_FIELDS)} gave no answer: "
                                   f"{err.strip() or code}")
        return None

    def rule_memtest(self) -> None:
        if not self.args.memtest or "memtest" in self.skip_rules:
            return
        argv = shlex.split(self.args.memtest_command)
        if not argv or shutil.which(argv[0]) is None:
            self.result.notes.append(f"memtest: {argv[0] if argv else '(none)'} is not installed: skipped")
            return
        if self.args.memtest_if_idle:  # the idle timer: never under a job
            busy, why = self.gpu_processes()
            if busy is None or busy:
                self.result.notes.append(f"memtest: skipped, GPUs in use or unknown ({why or busy})")
                return
        code, out, err = self.runner.run(argv, timeout=self.args.memtest_timeout)
        if code is None:
            self.add("memtest", f"{self.args.memtest_command}: did not finish: {err}")
        elif code != 0:
            tail = [line.strip(" |") for line in (out + err).splitlines() if re.search(r"fail|error", line, re.I)]
            self.add("memtest", f"{self.args.memtest_command}: exit {code}{': ' + tail[0][:100] if tail else ''}")

    # -- actions ---------------------------------------------------------------------------------
    def gpu_processes(self) -> tuple[dict[str, list[str]] | None, str]:
        """bus -> pids of the processes using each GPU, or None and why not."""
        code, out, err = self.smi("--query-compute-apps=gpu_bus_id,pid,process_name", "--format=csv,noheader")
        if code != 0:
            return None, err.strip() or str(code)
        busy: dict[str, list[str]] = {}
        for cells in ([c.strip() for c in line.split(",")] for line in out.splitlines()):
            if len(cells) >= 2 and cells[1].isdigit():
                busy.setdefault(bus_key(cells[0]), []).append(cells[1])
        return busy, ""

    def reset_gpus(self) -> None:
        wanted = {f.gpu for f in self.result.findings if f.action == "reset" and f.gpu}
        if not self.args.reset or not wanted:
            return
        busy, err = self.gpu_processes()
        if busy is None:
            for label in sorted(wanted):
                self.result.resets.append({"gpu": label, "done": False, "why": f"could not list GPU processes: {err}"})
            return
        free = []
        for gpu in self.result.gpus:
            if gpu.label not in wanted:
                continue
            pids = busy.get(bus_key(gpu.bus_id))
            if pids:
                self.result.resets.append({"gpu": gpu.label, "done": False,
                                           "why": f"refused: in use by pid {', '.join(pids)}"})
            else:
                free.append(gpu)
        if not free:
            return
        # nv-hostengine and dcgm-exporter hold every GPU open: a reset fails "in use" while they run
        stopped = [u for u in self.args.reset_stop_units
                   if self.runner.run([self.args.systemctl, "is-active", "--quiet", u])[0] == 0]
        if stopped:
            self.runner.run([self.args.systemctl, "stop", *stopped])
        try:
            for gpu in free:
                self.reset_one(gpu)
        finally:
            if stopped:  # started again whatever the reset did
                rc, _, err = self.runner.run([self.args.systemctl, "start", *stopped])
                if rc != 0:
                    self.result.notes.append(f"could not start {' '.join(stopped)} again: {err.strip() or rc}")

    def reset_one(self, gpu: Gpu) -> None:
        rc, rout, rerr = self.smi("-r", "-i", str(gpu.index))
        said = (rout + rerr).strip().splitlines()
        self.result.resets.append({"gpu": gpu.label, "done": rc == 0, "why": said[-1] if said else f"exit {rc}"})
        if rc == 0:  # its Xids are dealt with: the next check counts only newer ones (and resumes the node)
            why = mark_reset(self.args.state_dir, self.args.proc_root, gpu.bus_id, self.uptime())
            if why:
                self.result.notes.append(f"{gpu.label}: {why}")

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

