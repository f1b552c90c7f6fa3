#!/bin/bash
# Facts of systemd unit $1 in a booted node.
echo "enabled=$(systemctl is-enabled "$1" 2>&1)"
echo "active=$(systemctl is-active "$1" 2>&1)"
