"""Reproducibility: build an image twice in isolation and compare the two builds (archives, filesystem
images, initramfs, disks and OCI layouts) file by file, with diffoscope where it is installed."""
