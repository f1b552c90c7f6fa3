#!/bin/bash
# Facts of kernel module $1 in a booted node: loaded, blacklisted in the root file system's
# modprobe configuration, blacklisted in the initramfs. Only the initramfs's modprobe.d is read,
# streamed out of the archive once per boot (a driver-sized initramfs unpacked whole would not
# fit in /run).
name=$1
if grep -q "^$name " /proc/modules; then echo loaded=1; else echo loaded=0; fi
if modprobe -c 2>/dev/null | grep -qx "blacklist $name"; then echo rootfs=1; else echo rootfs=0; fi

initrd=${NODEFORGE_INITRD:-/boot/initrd.img-$(uname -r)}
conf=${NODEFORGE_INITRD_CONF:-/run/nodeforge-initramfs-modprobe.conf}

bytes() {  # bytes FILE OFFSET COUNT: that many bytes as hex
	dd if="$1" bs=1 skip="$2" count="$3" 2>/dev/null | od -An -tx1 | tr -d ' \n'
}

main_archive_offset() {  # past the uncompressed early archives (CPU microcode), as the kernel reads them
	local f=$1 off=0 hdr namesize filesize name
	while [ "$(dd if="$f" bs=1 skip="$off" count=6 2>/dev/null)" = 070701 ]; do
		while :; do
			hdr=$(dd if="$f" bs=1 skip="$off" count=110 2>/dev/null)
			namesize=$((16#${hdr:94:8}))
			filesize=$((16#${hdr:54:8}))
			name=$(dd if="$f" bs=1 skip=$((off + 110)) count=$((namesize - 1)) 2>/dev/null)
			off=$(((off + 110 + namesize + 3) & ~3))
			off=$(((off + filesize + 3) & ~3))
			[ "$name" = 'TRAILER!!!' ] && break
		done
		while [ "$(bytes "$f" "$off" 4)" = 00000000 ]; do off=$((off + 4)); done
	done
	echo "$off"
}

decompress() {  # the main archive's compressor, from its magic number
	case $(bytes "$1" "$2" 4) in
	28b52ffd) tail -c +$(($2 + 1)) "$1" | zstd -dcq ;;
	1f8b*) tail -c +$(($2 + 1)) "$1" | gzip -dc ;;
	fd377a58) tail -c +$(($2 + 1)) "$1" | xz -dc ;;
	02214c18) tail -c +$(($2 + 1)) "$1" | lz4 -dc ;;
	*) tail -c +$(($2 + 1)) "$1" ;;
	esac
}

if [ ! -f "$conf" ]; then
	off=$(main_archive_offset "$initrd")
	decompress "$initrd" "$off" 2>/dev/null | cpio -i --quiet --to-stdout 'etc/modprobe.d/*.conf' >"$conf.tmp" 2>/dev/null
	mv "$conf.tmp" "$conf"
fi
if grep -qx "blacklist $name" "$conf"; then
	echo initramfs=1
else
	echo initramfs=0
fi
