#!/bin/bash
# Facts of kernel module $1 in a booted node: loaded, blacklisted in the root file system's
# modprobe configuration, blacklisted in the initramfs (unpacked once per boot).
name=$1
if grep -q "^$name " /proc/modules; then echo loaded=1; else echo loaded=0; fi
if modprobe -c 2>/dev/null | grep -qx "blacklist $name"; then echo rootfs=1; else echo rootfs=0; fi
d=/run/nodeforge-initramfs
if [ ! -d "$d" ]; then mkdir -p "$d" && unmkinitramfs "/boot/initrd.img-$(uname -r)" "$d" >/dev/null 2>&1; fi
if cat "$d"/etc/modprobe.d/*.conf "$d"/main/etc/modprobe.d/*.conf 2>/dev/null | grep -qx "blacklist $name"; then
	echo initramfs=1
else
	echo initramfs=0
fi
