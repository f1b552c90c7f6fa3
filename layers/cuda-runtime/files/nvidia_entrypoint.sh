#!/bin/bash
# Entrypoint of the CUDA runtime and devel images: say which CUDA this is, warn when no driver is
# visible (the container was started without the NVIDIA container toolkit, or on a machine without
# a GPU), then run the command - or a shell when none was given.
if [ -t 1 ]; then
  echo "== CUDA ${CUDA_VERSION:-} (nodeforge) =="
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' || [ ! -e /dev/nvidiactl ]; then
  echo "WARNING: The NVIDIA Driver was not detected.  GPU functionality will not be available." >&2
  echo "   Use the NVIDIA Container Toolkit to start this container with GPU support; see" >&2
  echo "   https://docs.nvidia.com/datacenter/cloud-native/ ." >&2
fi
if [ $# -eq 0 ]; then
  exec /bin/bash
fi
exec "$@"
