"""A real registry (Debian's docker-registry) on 127.0.0.1 with filesystem storage in a directory,
for the tests' `registry` fixture and the size benchmark's pull sizes.

    with local_registry(tmp, log) as registry:   # "127.0.0.1:PORT"
        ..."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def local_registry(directory: Path, log: IO[str] | int = subprocess.DEVNULL) -> Iterator[str]:
    """HOST:PORT of a docker-registry serving from directory/data until the block ends; log takes its stderr."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (directory / "config.yml").write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: "
                                          f"{directory / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(directory / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=log)
    try:
        for _ in range(50):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def signed_cache(prefix: str) -> Iterator[tuple[Path, Path, Path, str]]:
    """(a temporary directory, an Ed25519 signing key, its public key, REGISTRY/fleet of a local
    registry in that directory): what a fleet-cache benchmark builds with."""
    import tempfile

    from support.keys import ed25519_pair

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp_name:
        tmp = Path(tmp_name)
        key, pub = ed25519_pair(tmp)
        (tmp / "registry").mkdir()
        with local_registry(tmp / "registry") as registry:
            yield tmp, key, pub, f"{registry}/fleet"
