#!/usr/bin/env bash
# The test suite as `make test` runs it (CI: .ci/run -> make test).
#
#  1. every test natively (unit, root/namespace, training, analysis, lab); the
#     netem-marked tests run with each impairment backend the kernel allows (the
#     userspace NFQUEUE backend always, netem where the kernel has it);
#  2. the netem-marked tests under sch_netem: done in step 1 when this kernel has it,
#     else inside the kernel lab (a stock Debian kernel under QEMU, `testbed lab`);
#  3. the demo experiment in its reduced form, end to end;
#  4. `vagrant up --provider=docker`, the reduced demo inside the box, its records checked, `vagrant
#     destroy` (scripts/vagrant-docker-check.sh; where vagrant and a Docker daemon are there: CI), and
#     `vagrant validate` of the Vagrantfile (every provider).
# It says which way step 2 went, and exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-${VENV:-.venv}/bin/python}"   # make exports VENV (sudo make VENV=... test)
export PYTHONDONTWRITEBYTECODE=1
export TESTBED_LEFTOVER_CHECK=1   # fail a pytest session that leaves tb-* objects behind
status=0
summary=()

step() { printf '\n\033[1m== %s ==\033[0m\n' "$*"; }

step "0/3 no testbed objects left on this machine"
# The suite builds networks under the tb-* names, so anything left by an earlier crash (a
# network left up, a killed run) would fail every network test with "already up".  It is
# listed and removed first; TESTBED_KEEP_LEFTOVERS=1 refuses to run instead.
left=$("$PY" -c 'import json; from testbed.network.cleanup import leftovers; l = {k: v for k, v in leftovers().items() if v}; print(json.dumps(l) if l else "")' 2>&1) || left="(cannot list: $left)"
if [ -n "$left" ]; then
  echo "testbed objects from an earlier run are on this machine: $left"
  if [ "${TESTBED_KEEP_LEFTOVERS:-0}" = 1 ]; then
    echo "TESTBED_KEEP_LEFTOVERS=1: not removing them; run \`testbed clean\` (or \`testbed net down\`) first"
    exit 2
  fi
  echo "removing them with \`testbed clean\` (set TESTBED_KEEP_LEFTOVERS=1 to refuse instead)"
  "$PY" -m testbed.cli clean || { echo "testbed clean failed"; exit 1; }
else
  echo "none"
fi

step "1/3 all tests, natively"
# netem-marked tests run here once per impairment backend that this kernel can use:
# netem where it has sch_netem, the userspace (NFQUEUE) backend everywhere.
"$PY" -m pytest -q tests
rc=$?
summary+=("native tests (netem-marked ones with every backend this kernel has): exit $rc")
[ $rc = 0 ] || status=1

step "2/3 netem tests under sch_netem"
if "$PY" -c 'from traffic_control.capabilities import has_netem; raise SystemExit(0 if has_netem() else 1)'; then
  echo "this kernel has sch_netem: the netem tests already ran NATIVELY in step 1"
  summary+=("netem tests: ran natively (kernel has sch_netem)")
else
  echo "this kernel has no sch_netem: netem tests run INSIDE THE KERNEL LAB (stock Debian kernel under QEMU)"
  start=$(date +%s)
  # TESTBED_LAB_TORCH=1: the gloo all-reduce test fits the lab's time budget (torch imports in ~30-140 s there)
  # node shells start slowly under TCG: 60 s per batch of 8 instead of 10 (TESTBED_* reaches the guest)
  TESTBED_NODE_START_TIMEOUT=60 TESTBED_LAB_TORCH=1 "$PY" -m testbed.cli lab --timeout 2400 -- "$PY" -m pytest -q -p no:cacheprovider -m netem tests/netem
  rc=$?
  summary+=("netem tests (kernel lab, $(( $(date +%s) - start )) s incl. boot): exit $rc")
  [ $rc = 0 ] || status=1
fi

step "3/3 demo (reduced) end to end"
if "$PY" -m testbed.cli --help 2>/dev/null | grep -q " demo "; then
  "$PY" -m testbed.cli demo --reduced
  rc=$?
  summary+=("demo (reduced): exit $rc")
  [ $rc = 0 ] || status=1
else
  summary+=("demo: not available")
fi

step "4/4 vagrant up --provider=docker: the reduced demo inside the box, then destroy"
if command -v vagrant >/dev/null && docker info >/dev/null 2>&1; then
  start=$(date +%s)
  PY="$PY" scripts/vagrant-docker-check.sh
  rc=$?
  summary+=("vagrant up --provider=docker + demo inside + destroy ($(( $(date +%s) - start )) s): exit $rc")
  [ $rc = 0 ] || status=1
else
  summary+=("vagrant docker box: not run (needs vagrant and a Docker daemon: WITH_VAGRANT=1 WITH_DOCKER=1 scripts/bootstrap.sh)")
fi

step "vagrant validate"
if command -v vagrant >/dev/null; then
  (cd vagrant && VAGRANT_CHECKPOINT_DISABLE=1 vagrant validate --ignore-provider)
  rc=$?
  summary+=("vagrant validate: exit $rc")
  [ $rc = 0 ] || status=1
else
  summary+=("vagrant validate: vagrant not installed (WITH_VAGRANT=1 scripts/bootstrap.sh installs it)")
fi

step "summary"
printf '%s\n' "${summary[@]}"
exit $status
