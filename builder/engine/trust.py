"""Extra certificate authorities for fetches during builds and resolution (a TLS-inspecting proxy).

NODEFORGE_CA_BUNDLE names a PEM file; unset, the host's locally added CAs
(/usr/local/share/ca-certificates/*.crt, Debian's convention) are used. A package step that
downloads wheels runs as a container (engine.offline.package_step) which is given the bundle as a
file in /tmp that its command reads into the wheel lines' NODEFORGE_CA_BUNDLE and removes before the
step's script runs: no build argument (the legacy builder writes those into the image's history),
nothing in the image's configuration, history or layers. A bundle that holds a private key is
refused. Wheels are still checked against the sha256 in the lock file."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import EnvironmentProblem

LOCAL_CAS = Path("/usr/local/share/ca-certificates")
MAX_BYTES = 100_000  # read into a shell variable of one step
PRIVATE_KEY = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")


def _read(path: Path, what: str) -> str:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise EnvironmentProblem(f"{what}: {path.stat().st_size} bytes (at most {MAX_BYTES}): set "
                                     "NODEFORGE_CA_BUNDLE to a file with only the CAs your network adds")
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise EnvironmentProblem(f"{what}: unreadable as a PEM file ({e}); name a PEM file or unset it") from None
    if m := PRIVATE_KEY.search(text):
        raise EnvironmentProblem(f"{what}, line {text[: m.start()].count(chr(10)) + 1}: expected CA certificates "
                                 "only, found a PRIVATE KEY block: refused; give a file with only the certificates "
                                 "of the CAs your network adds")
    return text


def extra_ca() -> str:
    """The extra CAs as PEM text ('' when there are none); a file that is missing, unreadable, too
    large or holds a private key is refused (EnvironmentProblem, exit 2)."""
    named = os.environ.get("NODEFORGE_CA_BUNDLE")
    if named:
        if not Path(named).is_file():
            raise EnvironmentProblem(f"NODEFORGE_CA_BUNDLE={named}: no such file; name a PEM file or unset it")
        text = _read(Path(named), f"NODEFORGE_CA_BUNDLE={named}")
    else:
        found = sorted(LOCAL_CAS.glob("**/*.crt")) if LOCAL_CAS.is_dir() else []
        text = "".join(_read(c, str(c)) for c in found)
    if len(text.encode()) > MAX_BYTES:
        raise EnvironmentProblem(f"the extra CA certificates are {len(text.encode())} bytes (at most {MAX_BYTES}): "
                                 "set NODEFORGE_CA_BUNDLE to a file with only the CAs your network adds")
    return text
