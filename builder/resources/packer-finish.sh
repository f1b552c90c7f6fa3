#!/bin/sh
# The last Packer provisioner of an exported node build: regenerate the initramfs when a provisioner
# changed what goes into it, then remove the upload directory, Packer's key and the node identity.
# The template sets `upload` on the line before.
set -eu
: "${upload:?set by the template}"
echo 'nodeforge: finishing the golden image'
if find /etc/modprobe.d /etc/modules-load.d /etc/initramfs-tools /usr/lib/modules \
	-newer "/boot/initrd.img-$(uname -r)" 2>/dev/null | grep -q .; then
	update-initramfs -u -k all
else
	echo 'nodeforge: initramfs is current'
fi
rm -rf "$upload" /root/.ssh/authorized_keys
: >/etc/machine-id
rm -f /var/lib/dbus/machine-id /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub
echo 'nodeforge: finished'
