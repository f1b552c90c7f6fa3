#!/usr/bin/env bash
# make gpu-check: on a machine with an NVIDIA GPU (driver and NVIDIA Container Toolkit installed),
# compile nodeforge's CUDA check program in each devel image, run it in the matching runtime
# image against the real driver through the image's own entrypoint, then run the images'
# GPU-only tests. Nothing heavy is built here: the images come from the local engine or, with
# REGISTRY=host:port, are pulled from where CI pushed them.
#   scripts/gpu-check.sh [CUDA_VERSION...]     default: 11.8.0 13.0.2
set -uo pipefail
cd "$(dirname "$0")/.."
NF=${NF:-.venv/bin/nodeforge}
versions=("$@")
((${#versions[@]})) || versions=(11.8.0 13.0.2)

command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "gpu-check: no NVIDIA driver here (nvidia-smi -L failed)" >&2; exit 2; }
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
for v in "${versions[@]}"; do
  devel=$(image "$v-devel-debian12") && runtime=$(image "$v-runtime-debian12") || { failed=1; continue; }
  ccbin=""; [[ $v == 11.* ]] && ccbin="-ccbin g++-11"
  echo "== CUDA $v: compile in $devel"
  if ! docker run --rm -v "$work:/out" --entrypoint /bin/sh "$devel" -c \
      "nvcc $ccbin -cudart shared -o /out/cuda-check-$v /usr/local/share/nodeforge/cuda-check.cu"; then
    echo "FAIL CUDA $v: nvcc failed"; failed=1; continue
  fi
  echo "== CUDA $v: run in $runtime with the real driver"
  out=$(docker run --rm --gpus all -v "$work:/out:ro" "$runtime" "/out/cuda-check-$v" 2>&1); rc=$?
  echo "$out" | sed 's/^/   | /'
  if [[ $rc -eq 0 && $out == *"kernel ok"* && $out != *"NVIDIA Driver was not detected"* ]]; then
    echo "ok   CUDA $v: kernel ran and its results check"
  else
    echo "FAIL CUDA $v: exit $rc"; failed=1
  fi
  for flavor in runtime devel; do
    name=cuda-${v%.*}-$flavor
    NODEFORGE_GPU=1 "$NF" test "images/$name.yaml" --report build/reports/gpu || failed=1
  done
done
((failed)) && { echo "gpu-check: FAILED"; exit 1; }
echo "gpu-check: all passed"
