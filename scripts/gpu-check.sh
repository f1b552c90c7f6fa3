#!/usr/bin/env bash
# make gpu-check: on a machine with an NVIDIA GPU (driver and NVIDIA Container Toolkit installed):
# 1. the node layers' programs against the real nvidia-smi, without booting an image: the power
#    unit in dry-run, the GPU textfile collector and `promtool check metrics` on its output, the
#    health check (JSON, no drain) and the topology probe;
# 2. compile nodeforge's CUDA check program in each devel image, run it in the matching runtime
#    image against the real driver through the image's own entrypoint, then run the images'
#    GPU-only tests. Nothing heavy is built here: the images come from the local engine or, with
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
  python3 layers/gpu-health/files/gpu-health.py --nvidia-smi "$smi" --xid-policy layers/gpu-health/files/xid-policy.tsv \
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
done
((failed)) && { echo "gpu-check: FAILED"; exit 1; }
echo "gpu-check: all passed"
