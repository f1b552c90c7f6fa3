"""Scripts nodeforge runs elsewhere (in a booted node, a test container, a throwaway container, a
Packer build), kept as files so that shellcheck reads them (`make lint`)."""

from __future__ import annotations

from importlib import resources


def text(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text()
