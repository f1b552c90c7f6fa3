#!/bin/bash
# Run inside a throwaway container of an image's base: pip for the resolution only (the image never
# gets it), the build host's extra CAs when given, then resources/pip_resolve.py.
set -e
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q --no-install-recommends python3-pip >&2
if [ -s /tmp/nodeforge-ca.pem ]; then
	cat /etc/ssl/certs/ca-certificates.crt /tmp/nodeforge-ca.pem >/tmp/ca-all.pem
	export PIP_CERT=/tmp/ca-all.pem
fi
python3 /tmp/nodeforge-pip.py
