"""Progress on standard error: one plain line per event (which image, which step, cached or built,
how long), and on a terminal a live status under them (rich): each image's current stage and
layer, the last line the package manager or step printed, and the time it has taken so far."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .escaping import for_terminal


class Progress:
    """say(): the plain lines (all a CI log gets). stage() and output(): the live status, shown only
    when live is asked for and the stream is a terminal."""

    def __init__(self, stream: Any = None, quiet: bool = False, live: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.lock = threading.Lock()
        is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.console = Console(file=self.stream, force_terminal=is_tty or None, highlight=False, soft_wrap=True)
        self.live_wanted = live and is_tty and not quiet
        self._live: Live | None = None
        self._status: dict[str, list[Any]] = {}  # image -> [stage, last output line, started]
        self._started = time.monotonic()

    def say(self, image: str, message: str) -> None:
        """One printable line (builder.escaping): a name or message cannot reach the terminal as
        a control sequence or start a line of its own."""
        if self.quiet:
            return
        image, message = for_terminal(image), for_terminal(message)
        with self.lock:
            if self._live is not None:
                self.console.print(Text(f"[{image}] {message}"))
            else:
                print(f"[{image}] {message}", file=self.stream, flush=True)

    def stage(self, image: str, what: str) -> None:
        """What an image is doing now (a stage and layer); its output line starts empty."""
        if not self.live_wanted:
            return
        with self.lock:
            self._status[image] = [for_terminal(what), "", time.monotonic()]
            if self._live is None:
                self._live = Live(get_renderable=self._render, console=self.console, refresh_per_second=4,
                                  transient=True)
                self._live.start()

    def output(self, image: str, line: str) -> None:
        """The last line the package manager or a step printed."""
        line = for_terminal(line.strip())
        if self.live_wanted and line and image in self._status:
            self._status[image][1] = line

    def done(self, image: str) -> None:
        with self.lock:
            self._status.pop(image, None)

    def close(self) -> None:
        with self.lock:
            if self._live is not None:
                self._live.stop()
                self._live = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _render(self) -> Table:
        table = Table.grid(padding=(0, 1))
        now = time.monotonic()
        for image, (what, line, started) in list(self._status.items()):
            table.add_row(Text(f"[{for_terminal(image)}]", style="bold"), Text(what, style="cyan"),
                          Text(f"{now - started:5.0f}s", style="dim"))
            if line:
                table.add_row("", Text(line[:160], style="dim", overflow="ellipsis", no_wrap=True), "")
        table.add_row(Text(f"elapsed {now - self._started:.0f}s", style="dim"), "", "")
        return table


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.start
