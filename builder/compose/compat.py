"""Which CUDA images run on a config's GPU nodes without cuda-compat: a CUDA image's
NVIDIA_REQUIRE_CUDA names the oldest driver branch it accepts (driver>=N, the minor-version
compatibility floor of its CUDA major: 11 needs 450, 12 needs 525, 13 needs 580); the config's
nodes run nvidia-driver.version (the config's value, else the layer's default). A CUDA 13 image on
a 535 node fails with cudaErrorInsufficientDriver unless the container carries cuda-compat
(forward compatibility, datacenter GPUs only)."""

from __future__ import annotations

import re

from ..definitions.load import Tree
from ..plan import BuildPlan

DRIVER_LAYER, DRIVER_PARAM = "nvidia-driver", "version"


def node_driver(tree: Tree, config: str | None) -> tuple[str, str] | None:
    """(driver version, where it is set) for the config's GPU nodes; None without a driver layer."""
    layer = tree.layers.get(DRIVER_LAYER)
    if layer is None or DRIVER_PARAM not in layer.params:
        return None
    cfg = tree.config(config)
    value = (cfg.data.get("params") or {}).get(DRIVER_LAYER, {}).get(DRIVER_PARAM) if cfg else None
    if value is not None:
        return str(value), f"config {cfg.name if cfg else ''}"
    return str(layer.params[DRIVER_PARAM].default), f"the {DRIVER_LAYER} layer's default"


def driver_warning(tree: Tree, plan: BuildPlan, config: str | None) -> str | None:
    """A warning when the plan is a CUDA image whose driver floor is above the config's node driver."""
    require = plan.env.get("NVIDIA_REQUIRE_CUDA")
    m = re.search(r"driver>=(\d+)", str(require.value)) if require else None
    driver = node_driver(tree, config) if m else None
    if m is None or driver is None:
        return None
    floor, (version, where) = int(m.group(1)), driver
    branch = int(version.split(".")[0])
    if branch >= floor:
        return None
    cuda = plan.env.get("CUDA_VERSION")
    return (f"warning: {plan.image} (CUDA {cuda.value if cuda else '?'}) needs driver >= {floor} "
            f"(NVIDIA_REQUIRE_CUDA), and the GPU nodes of {f'config {config}' if config else 'the default'} run "
            f"{version} ({where}): there it fails with cudaErrorInsufficientDriver unless the image carries "
            f"cuda-compat (forward compatibility, datacenter GPUs only); pair it with nodes on R{floor} or later")
