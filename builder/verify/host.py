"""What the machine running the tests offers: a GPU, kvm, the network."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import docker


def has_gpu() -> bool:
    if os.environ.get("NODEFORGE_GPU") in ("0", "1"):
        return os.environ["NODEFORGE_GPU"] == "1"
    if not Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def capabilities() -> dict[str, bool]:
    return {"gpu": has_gpu(), "kvm": os.environ.get("NODEFORGE_KVM") == "1",
            "network": os.environ.get("NODEFORGE_OFFLINE") != "1"}


def gpu_kwargs() -> dict[str, Any]:
    """Where a GPU is present, test containers get every GPU (as `docker run --gpus all`)."""
    if not has_gpu():
        return {}
    return {"device_requests": [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]}
