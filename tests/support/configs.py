"""Overrides that tests compose the shipped configs with."""

from __future__ import annotations

# dgx-h100 as it was meant to run, with NVIDIA's open kernel modules and GPUDirect RDMA through
# DMA-BUF: on Debian 12 only at 535.261.03 (the one open build; DKMS no longer builds it for
# bookworm-security's kernel), so the shipped config runs the proprietary modules. Composition of
# the open path is still tested with these.
DGX_OPEN_MODULES = ("nvidia-driver.kernel_module=open", "nvidia-driver.version=535.261.03",
                    "nvidia-driver.fabricmanager_version=535.261.03", "infiniband.peer_memory=dmabuf")
