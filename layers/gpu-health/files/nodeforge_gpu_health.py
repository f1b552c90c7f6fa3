"""nodeforge-gpu-health's model: rules, findings, GPUs, the command runner and the Xid policy table.

Installed beside the library in /usr/lib/python3/dist-packages (see layers/gpu-health/layer.yaml).
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nodeforge_node import cell, read_xid_policy, write_atomic

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

# the fabric rule's query (drivers 550 and later; the 535 branch answers "is not a valid field")
FABRIC_FIELDS = ("index", "pci.bus_id", "fabric.state", "fabric.status")

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

NVRM_PATTERNS = (
    re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^:]*:"
               r"\s*(?P<what>RmInitAdapter failed!?.*)"),
    re.compile(r"NVRM: (?P<what>GPU (?:at )?(?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
               r"\S* (?:GPU )?has fallen off the bus.*)"),
)
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]*\): "
                      r"(?P<code>\d+),\s*(?P<text>.*)")
DMESG_TIME = re.compile(r"^\[\s*(?P<t>\d+\.\d+)\]")


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
    return None if v is None else cell(v)


def as_int(v: str | None) -> int | None:
    v = value(v)
    if v is None:
        return None
    m = re.match(r"(0x[0-9a-fA-F]+|-?\d+)", v)
    if not m:
        return None
    return int(m.group(1), 0)


def load_policy(path: Path, overrides: dict[str, list[int]]) -> dict[int, tuple[str, str]]:
    """code -> (action, description): the node's one Xid policy table (node-lib's reader, the same one
    nodeforge-xid-rules generates the alerts from) with the per-action overrides."""
    return read_xid_policy(path, overrides)


def fabric_from_q(text: str) -> dict[str, dict[str, str]]:
    """bus -> {State, Status} of the Fabric sections of `nvidia-smi -q` (all GPUs or one, -i N)."""
    state: dict[str, dict[str, str]] = {}
    bus, in_fabric = "", False
    for line in text.splitlines():
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
    return state


def line_bus(line: str, xid: re.Match[str] | None) -> str:
    """The bus key an Xid or NVRM line names, '' for other lines."""
    if xid:
        return bus_key(xid.group("bus"))
    for pattern in NVRM_PATTERNS if "NVRM" in line else ():
        n = pattern.search(line)
        if n:
            return bus_key(n.group("bus"))
    return ""


# -- resets: Xids are counted since the GPU's last successful reset -------------------------------------
def boot_id(proc_root: str) -> str:
    try:
        return (Path(proc_root) / "sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def reset_marks(state_dir: str, proc_root: str) -> dict[str, float]:
    """bus key -> seconds since boot of the last successful reset in this boot (files last-reset-<bus>,
    'boot_id seconds'); a mark from an earlier boot is void (its kernel log is gone with it)."""
    marks: dict[str, float] = {}
    current = boot_id(proc_root)
    folder = Path(state_dir)
    if not current or not folder.is_dir():
        return marks
    for path in folder.glob("last-reset-*"):
        try:
            boot, seconds = path.read_text(encoding="utf-8").split()[:2]
            if boot == current:
                marks[bus_key(path.name.removeprefix("last-reset-"))] = float(seconds)
        except (OSError, ValueError):
            continue
    return marks


def mark_reset(state_dir: str, proc_root: str, bus: str, seconds: float | None) -> str:
    """Record a successful reset of `bus` at `seconds` since boot; '' or why it could not be recorded."""
    current = boot_id(proc_root)
    if seconds is None or not current:
        return "no boot id or uptime to record the reset against: its Xids keep counting"
    try:
        write_atomic(Path(state_dir) / f"last-reset-{bus_key(bus)}", f"{current} {seconds:.6f}\n")
    except OSError as exc:
        return f"could not record the reset in {state_dir}: {exc.strerror}"
    return ""
