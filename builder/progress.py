"""Progress lines on standard error, and a timer for them."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any


class Progress:
    """One line per event, on stderr: which image, which step, cached or built, how long."""

    def __init__(self, stream: Any = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.lock = threading.Lock()

    def say(self, image: str, message: str) -> None:
        if self.quiet:
            return
        with self.lock:
            print(f"[{image}] {message}", file=self.stream, flush=True)


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.start
