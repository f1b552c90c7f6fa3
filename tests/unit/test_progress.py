"""Progress: plain lines where the output is not a terminal (CI logs), a live status on one."""

from __future__ import annotations

import io

from builder.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_and_no_escape_codes_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress(out, live=True) as p:
        p.stage("node", "layer 2/6 kernel: building")
        p.output("node", "Setting up linux-image-6.1.0-50-amd64 ...")
        p.say("node", "layer 2/6 kernel   built   12.0s")
    assert out.getvalue() == "[node] layer 2/6 kernel   built   12.0s\n"


def test_a_terminal_shows_the_stage_the_last_output_line_and_the_time() -> None:
    out = Terminal()
    with Progress(out, live=True) as p:
        p.stage("node-minimal", "layer 2/6 kernel: building")
        p.output("node-minimal", "Setting up linux-image-6.1.0-50-amd64 ...\n")
        p.say("node-minimal", "layer 2/6 kernel   built   12.0s")
    text = out.getvalue()
    assert "\x1b[" in text  # drawn with rich
    for part in ("[node-minimal]", "layer 2/6 kernel: building", "Setting up linux-image-6.1.0-50-amd64",
                 "elapsed", "[node-minimal] layer 2/6 kernel   built   12.0s"):
        assert part in text, part


def test_quiet_prints_nothing() -> None:
    out = Terminal()
    with Progress(out, quiet=True, live=True) as p:
        p.stage("x", "building")
        p.say("x", "built")
    assert out.getvalue() == ""
