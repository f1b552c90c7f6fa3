"""Extra certificate authorities for fetches during builds and resolution (a TLS-inspecting proxy).

NODEFORGE_CA_BUNDLE names a PEM file; unset, the host's locally added CAs
(/usr/local/share/ca-certificates/*.crt, Debian's convention) are used. They reach build steps
that download wheels as the build argument NODEFORGE_CA_BUNDLE and are never written into an
image layer; wheels are still checked against the sha256 in the lock file."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import EnvironmentProblem

LOCAL_CAS = Path("/usr/local/share/ca-certificates")
MAX_BYTES = 100_000  # a build argument travels in the environment of one RUN


def extra_ca() -> str:
    named = os.environ.get("NODEFORGE_CA_BUNDLE")
    if named:
        p = Path(named)
        if not p.is_file():
            raise EnvironmentProblem(f"NODEFORGE_CA_BUNDLE={named}: no such file; name a PEM file or unset it")
        text = p.read_text()
    else:
        text = "".join(c.read_text() for c in sorted(LOCAL_CAS.glob("**/*.crt"))) if LOCAL_CAS.is_dir() else ""
    if len(text.encode()) > MAX_BYTES:
        raise EnvironmentProblem(f"the extra CA certificates are {len(text.encode())} bytes (at most {MAX_BYTES}): "
                                 "set NODEFORGE_CA_BUNDLE to a file with only the CAs your network adds")
    return text
