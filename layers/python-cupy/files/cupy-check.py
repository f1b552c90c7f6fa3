#!/usr/bin/python3
"""Which CUDA libraries CuPy loads, and what the runtime says about devices (no GPU needed)."""
import os

import cupy  # noqa: F401  (the CUDA runtime is linked in statically)
from cupy_backends.cuda.api import runtime
from cupy_backends.cuda.libs import cublas  # noqa: F401  (loads cuBLAS)

print("cuda runtime", runtime.runtimeGetVersion())
try:
    print("device count:", runtime.getDeviceCount())
except runtime.CUDARuntimeError as e:
    print("device:", e)
seen = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        path = line.split()[-1]
        name = os.path.basename(path)
        if name.startswith(("libcudart.so", "libcublas.so", "libcublasLt.so")) and path not in seen:
            seen.add(path)
            print("loaded", name, "from", os.path.dirname(path))
