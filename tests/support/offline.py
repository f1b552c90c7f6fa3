"""The stand-in NVIDIA packages as offline sources, served where build containers reach them.

NVIDIA's repositories cannot be reached everywhere (not from CI here): the container toolkit and the
fabric manager come from offline sources built from the stand-in packages in
tests/fixtures/container-toolkit (see its README) and served over HTTP on the engine's bridge.

    build_offline_sources(tmp)
    with serve(tmp) as base:
        nodeforge("build", "images/gpu-node.yaml", "-c", "dgx-h100", *offline_sets(base))

The suite serves them on OFFLINE_PORT: the source's URL is part of the layers' cache keys, so a
later session (tests/test_repro_images.py) finds the keys the suite's build used.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import re
import socket
import socketserver
import subprocess
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent.parent
STAND_INS = ROOT / "tests" / "fixtures" / "container-toolkit"
EPOCH = "1735689600"
OFFLINE_PORT = 18931          # fixed: the offline source's URL is part of the layer's cache key
Server = TypeVar("Server", bound=socketserver.BaseServer)
GROUPS = {"toolkit": ["nvidia-container-toolkit-base", "nvidia-container-toolkit"],
          "fabricmanager": ["nvidia-fabricmanager-535"]}


def build_offline_sources(out: Path) -> dict[str, Path]:
    """The stand-in packages as offline sources: a directory of .deb files and SHA256SUMS each
    (bit-identical on every run: SOURCE_DATE_EPOCH, root owner)."""
    dirs = {}
    for group, packages in GROUPS.items():
        d = out / group
        d.mkdir(parents=True, exist_ok=True)
        for pkg in packages:
            subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(STAND_INS / pkg), str(d)],
                           check=True, capture_output=True, env={**os.environ, "SOURCE_DATE_EPOCH": EPOCH})
        sums = subprocess.run("sha256sum *.deb", shell=True, cwd=d, check=True, capture_output=True, text=True)
        (d / "SHA256SUMS").write_text(sums.stdout)
        dirs[group] = d
    return dirs


def bridge_address() -> str:
    """The engine bridge's IPv4 address (docker0), where build containers reach the host."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "docker0"], capture_output=True, text=True).stdout
    m = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
    return m.group(1) if m else "172.17.0.1"


@contextmanager
def running(server: Server) -> Iterator[Server]:
    """server answering on a thread of its own until the block ends, then shut down and closed."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def serve(directory: Path, port: int = OFFLINE_PORT, fallback: bool = True) -> Iterator[str]:
    """Serve directory over HTTP on the bridge at port (any free port when it is taken and fallback
    is true, or when port is 0): the base URL, until the block ends."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    address = bridge_address()
    try:
        server = socketserver.ThreadingTCPServer((address, port), handler)
    except OSError:
        if not fallback:
            raise
        server = socketserver.ThreadingTCPServer((address, 0), handler)
    with running(server):
        yield f"http://{address}:{server.server_address[1]}"


@contextmanager
def offline_sources(port: int = OFFLINE_PORT) -> Iterator[str]:
    """The stand-in sources at port: the server already there when one serves them (the suite's,
    same URL, same keys), else one started here over freshly built sources."""
    address = bridge_address()
    url = f"http://{address}:{port}"
    with socket.socket() as s:
        taken = port != 0 and s.connect_ex((address, port)) == 0
    if taken:
        with urllib.request.urlopen(f"{url}/toolkit/SHA256SUMS", timeout=10) as r:
            assert b".deb" in r.read(), f"something else listens on {url}"
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="nodeforge-offline-") as d:
        build_offline_sources(Path(d))
        with serve(Path(d), port) as base:
            yield base


def sums_digest(base: str, group: str) -> str:
    """The sha256 of a served SHA256SUMS: an http source is pinned by the digest of its list."""
    with urllib.request.urlopen(f"{base}/{group}/SHA256SUMS", timeout=10) as r:
        return hashlib.sha256(r.read()).hexdigest()


def offline_sets(base: str) -> list[str]:
    """--set flags for the stand-in sources: the toolkit's first, then the fabric manager's."""
    return ["--set", f"nvidia-container-runtime.offline_source={base}/toolkit/",
            "--set", f"nvidia-container-runtime.offline_sums_sha256={sums_digest(base, 'toolkit')}",
            "--set", f"nvidia-driver.fabricmanager_source={base}/fabricmanager/",
            "--set", f"nvidia-driver.fabricmanager_sums_sha256={sums_digest(base, 'fabricmanager')}"]
