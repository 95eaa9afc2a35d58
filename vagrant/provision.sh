#!/usr/bin/env bash
# Runs inside the lab machine as root: netem where the kernel is the machine's own, the same bootstrap as
# every other path (venv in /opt, not in the synced checkout), then the doctor.
set -euo pipefail
cd /testbed
VENV=/opt/testbed-venv

in_container() { [ -f /.dockerenv ] || grep -qsw docker /proc/1/cgroup; }

if in_container; then
  # A container shares the host's kernel: modules cannot be loaded from here.
  if [ -d /sys/module/sch_netem ] || grep -qsw sch_netem /proc/modules; then
    echo "container on the host's kernel $(uname -r): sch_netem present"
  else
    echo "container on the host's kernel $(uname -r), which has no sch_netem: delay/jitter/loss come from the" \
         "userspace (NFQUEUE) backend, or netem inside the kernel lab (testbed lab -- ...), chosen as on any" \
         "machine and recorded in every manifest"
  fi
else
  # A VM boots its own (Ubuntu) kernel: netem is expected. Ubuntu cloud images ship it in linux-modules-extra.
  if ! modprobe sch_netem 2>/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "linux-modules-extra-$(uname -r)"
    if ! modprobe sch_netem; then
      echo "ERROR: this VM's kernel $(uname -r) has no sch_netem, although a VM is used for its own kernel" \
           "(fix: a box whose kernel ships sch_netem, TESTBED_BOX=...; or use --provider=docker, which says" \
           "which backend it falls back to)" >&2
      exit 1
    fi
  fi
fi

# `make` inside the machine uses this venv (the Makefile reads /etc/geo-testbed/venv).
mkdir -p /etc/geo-testbed
echo "$VENV" > /etc/geo-testbed/venv
make -C /testbed VENV="$VENV" bootstrap
testbed doctor
