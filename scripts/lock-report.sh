#!/bin/sh
# lock-report: every lock file against a fresh resolution (nodeforge lock --check --all): what moved
# upstream, and what an image's own pins hold below a security update, each marked [security] where
# the newer version comes from Debian's security archive. A report, for a scheduled CI job or a
# person: drift exits 0 (read the lines; relock with nodeforge lock), so is an archive that cannot be
# reached (the report says it was skipped); anything else nodeforge refuses exits with its code.
set -u
nf=${NF:-.venv/bin/nodeforge}
release=${SECURITY_RELEASE:-http://deb.debian.org/debian-security/dists/bookworm-security/InRelease}
if ! python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' "$release" 2>/dev/null; then
    echo "lock-report: skipped: Debian's security archive cannot be reached ($release)"
    exit 0
fi
"$nf" lock --check --all
rc=$?
case $rc in
    0) echo "lock-report: every lock is current" ;;
    1) echo "lock-report: the lines above moved upstream or are held below a security update ([security]); run nodeforge lock" ;;
    *) exit "$rc" ;;
esac
exit 0
