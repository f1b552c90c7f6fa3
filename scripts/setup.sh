#!/usr/bin/env bash
# Idempotent set-up of everything nodeforge and its tests need on Debian 12, as root:
# distribution packages, a virtualenv with the Python dependencies, a running Docker Engine.
# On a machine where all of it is present this takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  docker.io mmdebstrap                                  # engine and bases
  qemu-system-x86 qemu-utils ovmf                       # boot verification, disk conversion
  grub-efi-amd64-bin grub-pc-bin mtools dosfstools      # bootloaders and the ESP, written without mounting
  e2fsprogs fdisk pigz                                  # root filesystem from a directory, GPT; the root archive on every core
  docker-registry skopeo                                # a real registry on 127.0.0.1 for publish tests; OCI layouts copied by digest
  prometheus                                            # promtool for alert rules
  packer                                                # Packer export is validated and built for real
  openssh-client                                        # ssh-keygen: the key Packer logs in with
  openssl kmod zstd                                     # module signing (host openssl), modinfo reads signatures; repro reads the initramfs
  shellcheck                                            # make lint: the package's and the layers' scripts
  slurmctld slurmd slurm-client munge                   # matrix --submit slurm, tested against a one-node cluster
  git ca-certificates
)
VENV=${VENV:-.venv}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
  # the distribution starts its own registry service on :5000; the tests start their own
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
  pkill -f '^/usr/bin/docker-registry serve /etc/docker/registry' 2>/dev/null || true
  # and its Slurm and munge services: the tests run a cluster of their own in a directory
  systemctl disable --now slurmctld slurmd munge >/dev/null 2>&1 || true
fi

stamp="$VENV/.nodeforge-deps"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -x $VENV/bin/python || ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "setup: creating virtualenv $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[dev]'
  echo "$want" >"$stamp"
fi

if ! docker info >/dev/null 2>&1; then
  echo "setup: starting dockerd"
  mkdir -p /var/log
  setsid nohup dockerd >/var/log/nodeforge-dockerd.log 2>&1 </dev/null &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start; see /var/log/nodeforge-dockerd.log" >&2; exit 1; }
fi
echo "setup: ready (docker $(docker version -f '{{.Server.Version}}'), venv $VENV)"
