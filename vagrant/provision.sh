#!/usr/bin/env bash
# Runs inside the VM as root: the same bootstrap as CI, then the doctor.
set -euo pipefail
cd /testbed
# Ubuntu cloud images ship sch_netem in linux-modules-extra
if ! modprobe sch_netem 2>/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "linux-modules-extra-$(uname -r)" || true
  modprobe sch_netem || echo "sch_netem still missing: the userspace impairment backend will be used"
fi
VENV=/opt/testbed-venv scripts/bootstrap.sh
ln -sfn /opt/testbed-venv /testbed/.venv 2>/dev/null || true
testbed doctor || true
