"""Boot verification: node disks booted under qemu in three modes (direct kernel, UEFI with
OVMF, legacy BIOS), the boot-scope checks run by the image's boot-check unit, the verdict read
from the serial console. Acceleration is found by booting a tiny guest with a deadline."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO

from ..compose.image import output_name
from ..definitions.load import Tree
from ..errors import EnvironmentProblem
from ..node import assemble, outputs
from ..node.assemble import NodeArtifacts
from ..paths import build_dir
from ..plan import BuildPlan, Test
from . import guest
from .judges import probe_output
from .result import Result

MODES = ("direct", "uefi", "bios")  # the disk boots; `netboot` boots the netboot artifacts over HTTP
ALL_MODES = (*MODES, "netboot")
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
QEMU = "qemu-system-x86_64"
BUDGET_TCG, BUDGET_KVM = 420, 120  # seconds from power-on to verdict
SILENCE = 90  # seconds without a single console line before a boot counts as stuck

# Console lines that end a boot at once: waiting longer cannot make it pass.
FATAL = [
    (re.compile(r"Kernel panic - not syncing.*"), "kernel panic"),
    (re.compile(r"ALERT!.*does not exist.*|Gave up waiting for root.*"), "root file system not found"),
    (re.compile(r"Timed out waiting for device.*"), "a device never appeared"),
    (re.compile(r"nodeforge-net: (no nodeforge\.root|tmpfs failed|could not|.* does not have sha256).*"),
     "netboot failed"),
    (re.compile(r"You are in emergency mode.*|Entering emergency mode.*|Give root password for maintenance.*"),
     "emergency mode"),
    (re.compile(r"No bootable device.*"), "the firmware found nothing to boot"),
    (re.compile(r"UEFI Interactive Shell.*"), "the firmware found no boot loader"),
    (re.compile(r"error: (no such device|file .* not found|you need to load the kernel first|disk .* not found).*"),
     "boot loader error"),
]
# Console lines that fail the verdict but let the boot go on (the checks still report).
NOTED = [re.compile(r"Failed to start .*"), re.compile(r"Dependency failed for .*")]
_ACCEL: dict[str, str] = {}


def check_tools(mode: str) -> None:
    if shutil.which(QEMU) is None:
        raise EnvironmentProblem(f"{QEMU} is not installed; run `make setup` (qemu-system-x86)")
    if mode == "uefi" and not (OVMF_CODE.exists() and OVMF_VARS.exists()):
        raise EnvironmentProblem(f"UEFI boots need {OVMF_CODE}; run `make setup` (ovmf)")


def _accel_cache() -> Path:
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nodeforge" / f"accel-{boot_id}"


def detect_accel(kernel: Path, deadline: float = 10.0) -> str:
    """kvm when a tiny guest - the image's own kernel with no root, which panics at once -
    gets to its panic under kvm within the deadline, else tcg. Never judged by opening /dev/kvm:
    where the device opens but guests hang, only booting tells. Remembered until the host reboots."""
    forced = os.environ.get("NODEFORGE_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    if "accel" in _ACCEL:
        return _ACCEL["accel"]
    cache = _accel_cache()
    if cache.is_file() and cache.read_text().strip() in ("kvm", "tcg"):
        _ACCEL["accel"] = cache.read_text().strip()
        return _ACCEL["accel"]
    accel = "tcg"
    if Path("/dev/kvm").exists() and shutil.which(QEMU):
        cmd = [QEMU, "-accel", "kvm", "-m", "256", "-display", "none", "-monitor", "none", "-serial", "stdio",
               "-no-reboot", "-nic", "none", "-kernel", str(kernel), "-append", "console=ttyS0 panic=-1"]
        try:
            p = subprocess.run(cmd, capture_output=True, timeout=deadline)
            accel = "kvm" if b"Kernel panic" in p.stdout else "tcg"
        except subprocess.TimeoutExpired:
            accel = "tcg"
    _ACCEL["accel"] = accel
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(accel + "\n")
    return accel


def netboot_cmdline(art: NodeArtifacts, url: str, sha: str | None = None) -> str:
    """The command line boot.ipxe passes, with the root archive at url."""
    args = [a for a in art.cmdline.split() if not a.startswith("root=") and a != "ro"]
    sha = sha or art.sha256.get(art.files["rootfs"], "")
    return " ".join([*args, "boot=nodeforge-net", f"nodeforge.root={url}", f"nodeforge.root_sha256={sha}", "ip=dhcp"])


def boot_drive(art: NodeArtifacts, mode: str) -> tuple[Path, str] | None:
    """The file a mode boots as qemu's boot drive, and its format (the outputs table says which);
    None for a mode that boots no drive (netboot)."""
    if mode not in ALL_MODES:
        raise EnvironmentProblem(f"unknown boot mode {mode!r}; expected one of {', '.join(ALL_MODES)}")
    output = outputs.booted(art, mode)
    if output is None:
        can = [o.name for o in outputs.OUTPUTS.values() if mode in o.boots]
        raise EnvironmentProblem(f"{art.image} has nothing a {mode} boot can start; "
                                 f"add {' or '.join(can)} to outputs.formats")
    if output.drive is None:
        return None
    (role,) = output.files
    return art.path(role), output.drive


def qemu_command(art: NodeArtifacts, mode: str, accel: str, work: Path, checks: Path | None = None,
                 cmdline: str | None = None, memory: int = 1024, interactive: bool = False) -> list[str]:
    net = ["-nic", "user,model=virtio-net-pci"] if mode == "netboot" else ["-nic", "none"]
    cmd = [QEMU, "-accel", accel, "-m", str(memory), "-smp", "2", "-no-reboot", *net]
    cmd += ["-nographic"] if interactive else ["-display", "none", "-monitor", "none", "-serial", "stdio"]
    drive = boot_drive(art, mode)
    if drive is not None:
        # the node's disk boots first; the checks disk (when attached) is never a boot candidate
        cmd += ["-drive", f"file={drive[0]},format={drive[1]},if=none,id=disk,snapshot=on",
                "-device", "virtio-blk-pci,drive=disk,bootindex=1"]
    if checks is not None:
        cmd += ["-drive", f"file={checks},format=raw,if=none,id=checks,readonly=on",
                "-device", "virtio-blk-pci,drive=checks,serial=nodeforge-checks"]
    if mode in ("direct", "netboot"):
        cmd += ["-kernel", str(art.path("kernel")), "-initrd", str(art.path("initrd")),
                "-append", cmdline or art.cmdline]
    elif mode == "uefi":
        vars_copy = work / "OVMF_VARS.fd"
        shutil.copyfile(OVMF_VARS, vars_copy)
        cmd += ["-machine", "q35", "-drive", f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
                "-drive", f"if=pflash,format=raw,file={vars_copy}"]
    elif mode != "bios":
        raise EnvironmentProblem(f"unknown boot mode {mode!r}; expected one of {', '.join(ALL_MODES)}")
    return cmd


@dataclass
class BootOutcome:
    mode: str
    accel: str
    verdict: str  # passed | failed
    reason: str
    seconds: float
    log: Path
    report: guest.GuestReport
    noted: list[str] = field(default_factory=list)

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        clean = strip_ansi(text).replace("\r", "")
        kept = [x[:300] for x in clean.splitlines() if x.strip() and guest.MARKER not in x]
        return "\n".join(kept[-lines:])


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


@dataclass
class ConsoleWatcher:
    """Reads the console line by line: the guest's report, the first fatal line, the noted ones."""

    report: guest.GuestReport = field(default_factory=guest.GuestReport)
    fatal: str = ""
    noted: list[str] = field(default_factory=list)

    def scan(self, line: str) -> None:
        self.report.feed(line)
        if self.fatal or guest.MARKER in line:
            return
        clean = strip_ansi(line).strip()
        for pattern, what in FATAL:
            m = pattern.search(clean)
            if m:
                self.fatal = f"{what}: {m.group(0).strip()[:200]}"
                break
        for pattern in NOTED:
            m = pattern.search(clean)
            if m and m.group(0) not in self.noted:
                self.noted.append(m.group(0).strip()[:200])


class _Console:
    """qemu's serial console, read in a thread: into the log file and into lines."""

    def __init__(self, proc: subprocess.Popen[bytes], logf: BinaryIO) -> None:
        self.proc, self.logf = proc, logf
        self.lines: list[str] = []
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout
        buf = b""
        while chunk := self.proc.stdout.read1(65536):  # type: ignore[attr-defined]
            self.logf.write(chunk)
            self.logf.flush()
            buf += chunk
            *complete, buf = re.split(rb"\r?\n", buf)
            self.lines.extend(x.decode(errors="replace") for x in complete)
            if len(buf) > 1 << 20:
                self.lines.append(buf.decode(errors="replace"))
                buf = b""
        if buf:
            self.lines.append(buf.decode(errors="replace"))
        self.done.set()


def _watch(console: _Console, watcher: ConsoleWatcher, budget: float) -> str:
    """Follow the console until a verdict: '' when the guest finished or qemu ended, else why not."""
    start, seen = time.monotonic(), 0
    while True:
        finished = console.done.wait(0.25)
        while seen < len(console.lines):
            watcher.scan(console.lines[seen])
            seen += 1
        elapsed = time.monotonic() - start
        if watcher.fatal:
            return watcher.fatal
        if finished:
            return ""
        if watcher.report.ended and console.proc.poll() is None:
            try:  # the guest powers off after END; give it a moment, then stop it ourselves
                console.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            return ""
        if not console.lines and elapsed > SILENCE:
            return f"no console output within {SILENCE}s: the firmware or boot loader is stuck before the kernel"
        if elapsed > budget:
            return f"timed out: no verdict within {budget:.0f}s"


def _netboot(art: NodeArtifacts, cmdline: str | None, root_sha256: str | None) -> tuple[ThreadingHTTPServer, str, int]:
    """Serve the netboot artifacts; (server, command line, memory in MiB: the root lives in RAM)."""
    boot_drive(art, "netboot")  # refuses a node without the netboot artifacts
    server = serve(Path(art.dir))
    url = f"http://10.0.2.2:{server.server_address[1]}/{art.files['rootfs']}"  # the host, seen from qemu
    return server, cmdline or netboot_cmdline(art, url, root_sha256), 1024 + 2 * art.root_mib


def _stop(proc: subprocess.Popen[bytes], console: _Console, server: ThreadingHTTPServer | None) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    console.done.wait(5)
    if server is not None:
        server.shutdown()
        server.server_close()


def boot(art: NodeArtifacts, mode: str, log: Path, tests: list[Test] | None = None, cmdline: str | None = None,
         budget: float | None = None, root_sha256: str | None = None) -> BootOutcome:
    """Boot once and judge it. With tests, the checks disk is attached and the guest reports.
    netboot serves the netboot artifacts over HTTP; root_sha256 replaces the archive's digest."""
    check_tools(mode)
    accel = detect_accel(art.path("kernel"))
    budget = budget or (BUDGET_KVM if accel == "kvm" else BUDGET_TCG)
    log.parent.mkdir(parents=True, exist_ok=True)
    watcher = ConsoleWatcher()
    with tempfile.TemporaryDirectory(prefix="nodeforge-boot-") as tmp:
        work = Path(tmp)
        checks = None
        if tests is not None:
            checks = work / "checks.tar"
            checks.write_bytes(guest.checks_archive(tests, art.image, art.key))
        server, memory = None, 1024
        if mode == "netboot":
            server, cmdline, memory = _netboot(art, cmdline, root_sha256)
        cmd = qemu_command(art, mode, accel, work, checks, cmdline, memory=memory)
        start = time.monotonic()
        with log.open("wb") as logf:
            logf.write(("# " + " ".join(cmd) + "\n").encode())
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            console = _Console(proc, logf)
            try:
                reason = _watch(console, watcher, budget)
            finally:
                _stop(proc, console, server)
            seconds = time.monotonic() - start
    if not reason and proc.returncode not in (0, None) and not watcher.report.ended:
        last = [x for x in console.lines if x.strip()][-1:] or ["(no output)"]
        reason = f"qemu exited with status {proc.returncode}: {last[0].strip()[:200]}"
    outcome = BootOutcome(mode, accel, "failed", reason, seconds, log, watcher.report, watcher.noted)
    if not reason:
        outcome.reason = _judge(outcome, tests)
    outcome.verdict = "failed" if outcome.reason else "passed"
    return outcome


def serve(directory: Path) -> ThreadingHTTPServer:
    """An HTTP server for the netboot artifacts on a free loopback port, in a thread."""
    handler = functools.partial(QuietHandler, directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _judge(o: BootOutcome, tests: list[Test] | None) -> str:
    r = o.report
    if tests is None:
        return ""
    if not r.begun:
        return "the guest powered off without running the checks (is the kernel layer's boot_check_hook on?)"
    if not r.ended:
        return "the checks report stopped before its end"
    problems = []
    if r.failed_units:
        problems.append(f"failed units: {', '.join(r.failed_units)}")
    if r.state != "running" and not r.failed_units:
        problems.append(f"system state {r.state or 'unknown'}")
    for line in r.journal + o.noted:
        if line not in problems:
            problems.append(line)
    return "; ".join(problems[:6])


def boot_tests(tests: list[Test]) -> tuple[list[Test], list[Result]]:
    ok = [t for t in tests if guest.runnable(t)]
    bad = [Result(t, "failed", f"{t.kind} checks do not run in a booted VM") for t in tests if t not in ok]
    return ok, bad


def artifacts_for(plan: BuildPlan, tree: Tree) -> NodeArtifacts:
    """The node record of the plan's (image, config) pair: build/images/NAME[@CONFIG]/node.json."""
    output = output_name(plan)
    rebuild = plan.build_command
    art = assemble.load(tree.root, output)
    if art is None:
        raise EnvironmentProblem(f"{output} has no assembled disk; run `{rebuild}`")
    if art.cmdline != assemble.full_cmdline(plan):
        raise EnvironmentProblem(f"the assembled disk of {output} is out of date (its kernel command line "
                                 f"differs); run `{rebuild}`")
    return art


def run_boot_tests(plan: BuildPlan, tree: Tree, tests: list[Test], modes: tuple[str, ...] = MODES,
                   log_dir: Path | None = None) -> list[Result]:
    art = artifacts_for(plan, tree)
    runnable, results = boot_tests(tests)
    log_dir = log_dir or build_dir(tree.root) / "boot"
    for mode in modes:
        print(f"[{plan.image}] boot {mode}: {len(runnable)} checks ...", flush=True)
        o = boot(art, mode, log_dir / f"{output_name(plan)}-{mode}.log", runnable)
        results += results_of(o, runnable, plan)
        status = "passed" if o.verdict == "passed" else f"FAILED ({o.reason})"
        print(f"[{plan.image}] boot {mode}: {status} in {o.seconds:.1f}s ({o.accel}); serial log {o.log}",
              flush=True)
        if o.verdict == "failed":
            print("     | " + "\n     | ".join(o.tail().splitlines()), flush=True)
    return results


def results_of(o: BootOutcome, tests: list[Test], plan: BuildPlan) -> list[Result]:
    verdict_test = Test(f"boots to a verdict ({o.mode})", "boot", "boot", "verdict", {"mode": o.mode}, (),
                        f"images/{plan.image}.yaml", None)
    out = [Result(verdict_test, o.verdict, o.reason or (o.report.boot_time or ""), o.seconds,
                  o.tail() if o.verdict == "failed" else "")]
    for i, t in enumerate(tests):
        named = dataclasses.replace(t, name=f"{t.name} [{o.mode}]")
        got = o.report.probes.get(i)
        if got is None:
            why = ("its output was garbled on the console" if i in o.report.garbled
                   else f"not reported (boot {o.verdict}{': ' + o.reason if o.reason else ''})")
            out.append(Result(named, "failed", why))
            continue
        code, stdout, stderr = got
        why = guest.judge(t, code, stdout, stderr)
        out.append(Result(named, "failed" if why else "passed", why, 0.0, probe_output(code, stdout, stderr)))
    return out


def interactive(art: NodeArtifacts, mode: str, cmdline: str | None = None) -> int:
    """Boot with the serial console on this terminal (Ctrl-A X quits qemu)."""
    check_tools(mode)
    accel = detect_accel(art.path("kernel"))
    with tempfile.TemporaryDirectory(prefix="nodeforge-boot-") as tmp:
        cmd = qemu_command(art, mode, accel, Path(tmp), None, cmdline, interactive=True)
        print(f"booting {art.image} ({mode}, {accel}); the disk is a snapshot, nothing is written back. "
              "Ctrl-A X quits.", flush=True)
        return subprocess.call(cmd)
