#!/bin/bash
# Facts of the path $1 for the file check, in a test container or a booted node: exit 3 when
# nothing is there; else "mode user uid group gid type", the link target (or an empty line),
# the sha256 of a regular file (or an empty line), a marker line, then the first 252 KiB.
p=$1
[ -e "$p" ] || [ -L "$p" ] || exit 3
stat -c '%a %U %u %G %g %F' -- "$p"
readlink -- "$p" || echo
if [ -f "$p" ] && [ ! -L "$p" ]; then sha256sum -- "$p"; else echo; fi
echo @@content@@
if [ -f "$p" ]; then head -c 258048 -- "$p"; fi
exit 0
