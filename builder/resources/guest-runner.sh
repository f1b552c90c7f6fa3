#!/bin/sh
# The boot-scope checks of a node image, run once by the image's boot-check unit from the checks
# disk. Beside this script: meta (MARKER, IMAGE, KEY, COUNT, OUT_LIMIT, ERR_LIMIT), list (one
# "id timeout user" line per probe) and p/<id> (the probes). One line per probe on the console:
#   MARKER R <id> <exit status> <stdout: gzip+base64> <stderr: gzip+base64>
# then the system state, the failed units, the journal's boot errors and the boot time.
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$here/meta"
M=$MARKER
enc() { head -c "$2" "$1" | gzip -c | base64 -w0; }
probe() {
	id=$1 t=$2 user=$3
	if [ "$user" = - ]; then
		timeout -k 5 "$t" bash "$here/p/$id" >"$here/out" 2>"$here/err" </dev/null
	else
		timeout -k 5 "$t" runuser -u "$user" -- bash "$here/p/$id" >"$here/out" 2>"$here/err" </dev/null
	fi
	rc=$?
	echo "$M R $id $rc $(enc "$here/out" "$OUT_LIMIT") $(enc "$here/err" "$ERR_LIMIT")"
}
echo "$M BEGIN $COUNT $KEY ($IMAGE)"
while read -r id t user; do
	probe "$id" "$t" "$user"
done <"$here/list"
echo "$M STATE $(systemctl is-system-running 2>/dev/null)"
systemctl list-units --failed --plain --no-legend --no-pager 2>/dev/null | awk '{print $1}' >"$here/failed"
echo "$M FAILED $(enc "$here/failed" 65536)"
journalctl -b -o cat --no-pager 2>/dev/null \
	| grep -E 'Timed out waiting for device|Dependency failed for|Failed to start' >"$here/journal"
echo "$M JOURNAL $(enc "$here/journal" 65536)"
echo "$M TIME $(systemd-analyze time 2>/dev/null | head -n 1 | base64 -w0)"
echo "$M END"
