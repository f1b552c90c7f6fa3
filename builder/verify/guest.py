"""Boot-scope checks inside a booted node. The host writes one probe script per check into a tar
archive; the archive is attached to the VM as a raw disk with serial `nodeforge-checks`, which
starts the image's boot-check unit (layers/kernel). It runs every probe once the boot has
finished and prints one line per probe on the serial console behind a fixed marker:

    @@NODEFORGE@@ R <id> <exit status> <stdout: gzip+base64> <stderr: gzip+base64>

then the system state, failed units and the journal's boot errors, and powers off. The host
judges the probe output with the judges of verify.judges, as for the container checks."""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import re
import tarfile
from dataclasses import dataclass, field

from .. import resources
from ..plan import Test
from .judges import PROBE_JUDGES

MARKER = "@@NODEFORGE@@"
OUT_LIMIT, ERR_LIMIT = 262144, 65536


def probe_script(test: Test) -> str:
    judge = PROBE_JUDGES.get(test.kind)
    if judge is None:
        raise ValueError(f"{test.kind} checks do not run in a booted VM")
    return judge.probe(test.spec)


# the first module check streams modprobe.d out of the initramfs (with the NVIDIA driver's modules,
# about 50 MB compressed, under software emulation): it gets longer than a plain probe
MODULE_PROBE_TIMEOUT = 180


def probe_timeout(test: Test) -> int:
    if test.kind == "module":
        return MODULE_PROBE_TIMEOUT
    return int(test.spec.get("timeout") or 60)


def checks_archive(tests: list[Test], image: str, key: str) -> bytes:
    """The tar archive written to the checks disk (padded to whole sectors): the runner, its meta
    and list files and one probe per test."""
    meta = (f"MARKER='{MARKER}'\nIMAGE='{image}'\nKEY='{key[:12]}'\nCOUNT={len(tests)}\n"
            f"OUT_LIMIT={OUT_LIMIT}\nERR_LIMIT={ERR_LIMIT}\n")
    listing = "".join(f"{i} {probe_timeout(t)} {t.spec.get('user') or '-'}\n" for i, t in enumerate(tests))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        def add(name: str, text: str, mode: int) -> None:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
        add("run", resources.text("guest-runner.sh"), 0o755)
        add("meta", meta, 0o644)
        add("list", listing, 0o644)
        for i, t in enumerate(tests):
            add(f"p/{i}", f"# {t.layer}: {t.name}\n" + probe_script(t), 0o644)
    data = buf.getvalue()
    return data + b"\0" * (-len(data) % 4096)


def _decode(field_: str) -> str | None:
    try:
        return gzip.decompress(base64.b64decode(field_, validate=True)).decode(errors="replace")
    except (binascii.Error, OSError, EOFError, ValueError):
        return None


@dataclass
class GuestReport:
    """What the guest printed behind the marker."""

    begun: bool = False
    ended: bool = False
    probes: dict[int, tuple[int, str, str]] = field(default_factory=dict)
    garbled: list[int] = field(default_factory=list)
    state: str = ""
    failed_units: list[str] = field(default_factory=list)
    journal: list[str] = field(default_factory=list)
    boot_time: str = ""

    def feed(self, line: str) -> None:
        at = line.find(MARKER)
        if at < 0:
            return
        parts = line[at + len(MARKER):].split()
        if not parts:
            return
        kind, rest = parts[0], parts[1:]
        if kind == "BEGIN":
            self.begun = True
        elif kind == "R" and len(rest) >= 2 and rest[0].isdigit():
            pid = int(rest[0])
            out = _decode(rest[2]) if len(rest) > 2 else ""
            err = _decode(rest[3]) if len(rest) > 3 else ""
            if out is None or err is None or not re.fullmatch(r"-?\d+", rest[1]):
                self.garbled.append(pid)
                return
            self.probes[pid] = (int(rest[1]), out, err)
        elif kind == "STATE":
            self.state = rest[0] if rest else ""
        elif kind == "FAILED":
            self.failed_units = (_decode(rest[0]) or "").split() if rest else []
        elif kind == "JOURNAL":
            self.journal = [x for x in (_decode(rest[0]) or "").splitlines() if x.strip()] if rest else []
        elif kind == "TIME":
            try:
                self.boot_time = base64.b64decode(rest[0]).decode(errors="replace").strip() if rest else ""
            except (binascii.Error, ValueError):
                self.boot_time = ""
        elif kind == "END":
            self.ended = True


def judge(test: Test, code: int, out: str, err: str) -> str:
    """'' when the probe output satisfies the check, else why not."""
    return PROBE_JUDGES[test.kind].judge(test.spec, (code, out, err))


def runnable(test: Test) -> bool:
    try:
        probe_script(test)
        return True
    except ValueError:
        return False

