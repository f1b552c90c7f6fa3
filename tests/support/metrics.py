"""Prometheus text files that node programs write, checked as the node exporter's reader would."""

from __future__ import annotations

import shutil
import subprocess


def assert_promtool_accepts(text: str) -> None:
    """`promtool check metrics` finds nothing wrong with the text, where promtool is installed (Debian's
    prometheus package); without it, nothing is checked."""
    if shutil.which("promtool"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                              check=False)
        assert lint.returncode == 0, lint.stdout + lint.stderr
