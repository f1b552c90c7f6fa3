#!/usr/bin/env bash
# make gpu-check: on a machine with an NVIDIA GPU (driver and NVIDIA Container Toolkit installed):
# 0. what the driver itself reports: the profiling option under the key /proc/driver/nvidia/params
#    prints (RmProfilingAdminOnly), DMA-BUF support (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, which the
#    open kernel modules give and GPUDirect RDMA through DMA-BUF needs), and the NVIDIA display/3D
#    controllers on the PCI bus (vendor 0x10de, class 0x0300/0x0302) against the GPUs nvidia-smi -L lists;
# 1. the node layers' programs against the real nvidia-smi, without booting an image: the power
#    unit in dry-run, the GPU textfile collector and `promtool check metrics` on its output, the
#    health check (JSON, no drain) and the topology probe;
# 2. compile nodeforge's CUDA check program in each devel image, run it in the matching runtime
#    image against the real driver through the image's own entrypoint, then run the images'
#    GPU-only tests, the library check in each per-library runtime image and the cuDNN check in
#    the cuDNN runtime image. Nothing heavy is built here: the images come from the local engine or, with
#    REGISTRY=host:port, are pulled from where CI pushed them.
#   scripts/gpu-check.sh [CUDA_VERSION...]     default: 11.8.0 13.0.2
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
NF=${NF:-.venv/bin/nodeforge}
versions=("$@")
((${#versions[@]})) || versions=(11.8.0 13.0.2)

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L; then
  echo "gpu-check: no NVIDIA driver here (nvidia-smi -L failed)" >&2; exit 2
fi
docker run --rm --gpus all --entrypoint /bin/true nodeforge/container-base:bookworm 2>/dev/null \
  || echo "gpu-check: note: 'docker run --gpus all' failed; is the NVIDIA Container Toolkit configured?" >&2

image() {  # local tag, pulled from $REGISTRY when absent
  local ref=nodeforge/cuda:$1
  if ! docker image inspect "$ref" >/dev/null 2>&1 && [[ -n ${REGISTRY:-} ]]; then
    docker pull -q "$REGISTRY/$ref" >/dev/null && docker tag "$REGISTRY/$ref" "$ref"
  fi
  docker image inspect "$ref" >/dev/null 2>&1 || { echo "gpu-check: $ref is not here; build it or set REGISTRY" >&2; return 1; }
  echo "$ref"
}

failed=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() {  # step [--fail-from N] NAME COMMAND...: run, indent its output, fail on exit >= N (default 1)
  local fail_from=1
  if [[ $1 == --fail-from ]]; then fail_from=$2; shift 2; fi
  local name=$1; shift
  echo "== $name"
  "$@" > "$work/out" 2>&1; local rc=$?
  sed 's/^/   | /' "$work/out"
  if ((rc >= fail_from)); then echo "FAIL $name: exit $rc"; failed=1; return "$rc"; fi
  if ((rc)); then echo "ok   $name (exit $rc: a finding about this machine, not a failure of the check)"; else echo "ok   $name"; fi
}
promtool_check() {  # exit 1 is a format error; exit 3 with only DCGM's naming lints passes
  local rc=0
  cat "$1"/*.prom | promtool check metrics > "$work/lint" 2>&1 || rc=$?
  cat "$1"/*.prom
  if grep -v -e "label names should be written in 'snake_case' not 'camelCase'" \
      -e 'counter metrics should have "_total" suffix' -e "metric name should not include type 'counter'" \
      "$work/lint"; then return 1; fi
  ((rc == 0 || rc == 3))
}
driver_params() {  # the option's registry key, as the driver prints it (not the NVreg_ alias)
  grep -E '^RmProfilingAdminOnly: [01]$' /proc/driver/nvidia/params
}
dmabuf_supported() {  # cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124) for every GPU
  local open=0
  grep -q 'Open Kernel Module' /proc/driver/nvidia/version && open=1
  head -1 /proc/driver/nvidia/version
  python3 - "$open" <<'PY'
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
n, v = ctypes.c_int(), ctypes.c_int()
if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
    print("cuInit or cuDeviceGetCount failed")
    sys.exit(2)
bad = 0
for i in range(n.value):
    dev = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    rc = cuda.cuDeviceGetAttribute(ctypes.byref(v), 124, dev)
    print(f"GPU {i}: DMA-BUF supported = {v.value if rc == 0 else 'unknown (rc %d)' % rc}")
    bad += rc != 0 or v.value != 1
if bad and sys.argv[1] == "1":
    print("the open kernel modules are loaded but the driver reports no DMA-BUF support")
    sys.exit(2)
if bad:
    print("proprietary kernel modules: no DMA-BUF (GPUDirect RDMA needs the open modules or OFED's peermem)")
    sys.exit(1)
PY
}
pci_count() {  # NVIDIA GPUs on the PCI bus against the GPUs the driver lists
  local pci=0 dev smi
  for dev in /sys/bus/pci/devices/*; do
    [[ $(<"$dev/vendor") == 0x10de ]] || continue
    case $(<"$dev/class") in 0x0300*|0x0302*) pci=$((pci + 1)) ;; esac
  done
  smi=$(nvidia-smi -L | grep -c '^GPU ')
  echo "PCI: $pci NVIDIA GPUs (class 0x0300/0x0302); nvidia-smi -L: $smi"
  ((pci == smi)) || { echo "the driver sees $smi of $pci GPUs (a GPU fell off the bus, failed to initialise or is excluded)"; return 1; }
}
step "driver option key: RmProfilingAdminOnly in /proc/driver/nvidia/params" driver_params
# exit 1: proprietary modules without DMA-BUF, a fact about this machine; 2 and above are failures
step --fail-from 2 "DMA-BUF support reported by the driver (open kernel modules)" dmabuf_supported
step "GPUs on the PCI bus equal the GPUs the driver lists" pci_count
smi=$(command -v nvidia-smi)
step "gpu-power apply --dry-run (clamped to each GPU's range, nothing set)" \
  python3 layers/gpu-power/files/nodeforge-gpu-power apply --dry-run --nvidia-smi "$smi" --power-limit 100000
mkdir -p "$work/textfile"
step "GPU textfile collector" \
  python3 layers/gpu-monitoring/files/nodeforge-gpu-metrics --nvidia-smi "$smi" --output-dir "$work/textfile" --no-xid \
  && step "promtool check metrics on the collector's output (format errors fail; DCGM's own naming lints are expected)" \
    promtool_check "$work/textfile"
# gpu-health: 1 and 2 are honest findings (WARNING, CRITICAL) on a real node; 3 (UNKNOWN) means a query failed
step --fail-from 3 "gpu-health (JSON, no drain)" \
  python3 layers/gpu-health/files/gpu-health.py --nvidia-smi "$smi" --xid-policy layers/node-lib/files/xid-policy.tsv \
    --drain no --json
# numa probe: 1 is a cross-socket GPU/NIC warning about the machine; 2 and above are failures
step --fail-from 2 "numa-topology probe" python3 layers/numa-topology/files/numa-probe.py --nvidia-smi "$smi" --json
for v in "${versions[@]}"; do
  if ! devel=$(image "$v-devel-debian12") || ! runtime=$(image "$v-runtime-debian12"); then failed=1; continue; fi
  ccbin=""; [[ $v == 11.* ]] && ccbin="-ccbin g++-11"
  echo "== CUDA $v: compile in $devel"
  if ! docker run --rm -v "$work:/out" --entrypoint /bin/sh "$devel" -c \
      "nvcc $ccbin -cudart shared -o /out/cuda-check-$v /usr/local/share/nodeforge/cuda-check.cu"; then
    echo "FAIL CUDA $v: nvcc failed"; failed=1; continue
  fi
  echo "== CUDA $v: run in $runtime with the real driver"
  out=$(docker run --rm --gpus all -v "$work:/out:ro" "$runtime" "/out/cuda-check-$v" 2>&1); rc=$?
  printf '%s\n' "$out" | sed 's/^/   | /'
  if [[ $rc -eq 0 && $out == *"kernel ok"* && $out != *"NVIDIA Driver was not detected"* ]]; then
    echo "ok   CUDA $v: kernel ran and its results check"
  else
    echo "FAIL CUDA $v: exit $rc"; failed=1
  fi
  for flavor in runtime devel; do
    name=cuda-${v%.*}-$flavor
    NODEFORGE_GPU=1 "$NF" test "images/$name.yaml" --report build/reports/gpu || failed=1
  done
  # the per-library runtimes of this version (images/cuda-X.Y-runtime-LIB.yaml): the library check
  # with that one family, compiled in devel, computes and checks its result in the image
  for lib in cublas cufft nccl; do
    [[ -f images/cuda-${v%.*}-runtime-$lib.yaml ]] || continue
    per=$(image "$v-runtime-$lib-debian12") || { failed=1; continue; }
    define=CHECK_${lib^^}
    if ! docker run --rm -v "$work:/out" --entrypoint /bin/sh "$devel" -c "nvcc -D$define -cudart shared \
        -o /out/cuda-library-check-$lib /usr/local/share/nodeforge/cuda-library-check.cu -l$lib"; then
      echo "FAIL CUDA $v $lib: nvcc failed"; failed=1; continue
    fi
    step "CUDA $v: $lib computes and checks in $per" \
      docker run --rm --gpus all -v "$work:/out:ro" "$per" "/out/cuda-library-check-$lib"
  done
  # cuDNN: the check compiled in the cuDNN devel image runs a ReLU in the cuDNN runtime image
  if [[ -f images/cuda-${v%.*}-cudnn-devel.yaml ]]; then
    if cudnn_devel=$(image "$v-cudnn-devel-debian12") && cudnn=$(image "$v-cudnn-runtime-debian12") \
        && docker run --rm -v "$work:/out" --entrypoint /bin/sh "$cudnn_devel" -c \
          "nvcc -cudart shared -o /out/cudnn-check-$v /usr/local/share/nodeforge/cudnn-check.cu -lcudnn"; then
      step "CUDA $v: cuDNN computes and checks in $cudnn" \
        docker run --rm --gpus all -v "$work:/out:ro" "$cudnn" "/out/cudnn-check-$v"
    else
      echo "FAIL CUDA $v: cuDNN images missing or nvcc failed"; failed=1
    fi
  fi
done
((failed)) && { echo "gpu-check: FAILED"; exit 1; }
echo "gpu-check: all passed"
