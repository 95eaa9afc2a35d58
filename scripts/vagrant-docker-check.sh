#!/usr/bin/env bash
# `vagrant up` for real, as a user runs it: from this checkout, the docker provider brings the lab up
# (its image built here from Debian's packages), provisions it with the bootstrap, runs the reduced demo
# inside, and this script checks, from the host, that the run's figures, summary and traces came back
# through the synced folder and that every trial had an impairment backend (not `none`); then
# `vagrant destroy -f`, and nothing of the box may be left: no container, no Docker network, no new
# dangling image layer (the box and trainer images themselves are the cache, kept on purpose).
#
#   sudo scripts/vagrant-docker-check.sh        # CI: scripts/run-tests.sh step 4 (WITH_VAGRANT=1, WITH_DOCKER=1)
#
# Exit status: 0 all held; 1 a step failed (named); 2 this machine cannot run it (no vagrant or daemon).
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo/vagrant"
export VAGRANT_CHECKPOINT_DISABLE=1 VAGRANT_NO_COLOR=1
PY="${PY:-${VENV:-.venv}/bin/python}"
case "$PY" in /*) ;; *) PY="$repo/$PY" ;; esac   # run-tests.sh passes it relative to the checkout
export TESTBED_PYTHON="$PY"
LABEL=org.geo-testbed.vagrant=box

say() { printf '[vagrant-docker-check] %s\n' "$*" >&2; }
fail() { say "FAILED: $*"; status=1; }

command -v vagrant >/dev/null || { say "vagrant is not installed (fix: sudo WITH_VAGRANT=1 scripts/bootstrap.sh)"; exit 2; }
docker info >/dev/null 2>&1 || { say "no Docker daemon (fix: sudo WITH_DOCKER=1 scripts/bootstrap.sh)"; exit 2; }
if [ -n "$(docker ps -aq --filter "label=$LABEL")" ]; then
  say "a lab box is already there (docker ps --filter label=$LABEL): \`cd vagrant && vagrant destroy -f\` first"
  exit 2
fi

status=0
run_name="vagrant-check-$(date +%Y%m%d-%H%M%S)"
results="$repo/results/$run_name"
networks_before="$(docker network ls -q | sort)"
dangling_before="$(docker images -q --filter dangling=true | sort)"
t0=$(date +%s)

destroy() {
  local t=$(date +%s)
  vagrant destroy -f >&2 || fail "vagrant destroy -f"
  say "vagrant destroy: $(( $(date +%s) - t )) s"
}
trap 'destroy; trap - EXIT' EXIT

t=$(date +%s)
if ! vagrant up --provider=docker; then
  fail "vagrant up --provider=docker"
  exit 1
fi
say "vagrant up (image + container + bootstrap): $(( $(date +%s) - t )) s"

t=$(date +%s)
vagrant ssh -c "cd /testbed && sudo make demo-reduced DEMO_RESULTS=results/$run_name" \
  || fail "the reduced demo inside the box"
say "demo (reduced) inside the box: $(( $(date +%s) - t )) s"

# What came back through the synced folder, read on the host.
"$PY" - "$results" <<'EOF' || status=1
import json, sys
from pathlib import Path

root = Path(sys.argv[1])
runs = sorted(root.glob("demo_reduced/*/"))
problems = []
if not runs:
    sys.exit(f"FAILED: no run directory under {root}/demo_reduced")
run = runs[-1]
trials = sorted(run.glob("trials/*/manifest.json"))
if len(trials) < 7:
    problems.append(f"{len(trials)} trial manifests, the reduced demo has 7")
for m in trials:
    man = json.loads(m.read_text())
    backend = man.get("network", {}).get("impairment", {}).get("backend")
    if backend in (None, "none"):
        problems.append(f"{m.parent.name}: impairment backend {backend!r}: delay was skipped")
    if man.get("status") != "ok":
        problems.append(f"{m.parent.name}: status {man.get('status')!r}")
    if not (m.parent / "trace.json").is_file():
        problems.append(f"{m.parent.name}: no trace.json")
figures = sorted(run.glob("figures/*.png"))
if not figures:
    problems.append("no figures/*.png")
if not (run / "summary.md").is_file():
    problems.append("no summary.md")
backends = sorted({json.loads(m.read_text())["network"]["impairment"]["backend"] for m in trials})
print(f"[vagrant-docker-check] {run}: {len(trials)} trials (impairment {', '.join(backends)}), "
      f"{len(figures)} figures, summary.md {'present' if (run / 'summary.md').is_file() else 'missing'}",
      file=sys.stderr)
for p in problems:
    print(f"[vagrant-docker-check] FAILED: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF

destroy
trap - EXIT
left="$(docker ps -aq --filter "label=$LABEL")"
[ -z "$left" ] || fail "containers left after destroy: $left"
[ "$(docker network ls -q | sort)" = "$networks_before" ] || fail "Docker networks differ after destroy"
new_dangling="$(comm -13 <(echo "$dangling_before") <(docker images -q --filter dangling=true | sort))"
[ -z "$new_dangling" ] || fail "dangling image layers left: $new_dangling"
[ ! -L "$repo/.venv" ] || fail "the box wrote a .venv link into the checkout"
# The box's networks lived in the container's namespaces: nothing of the testbed's may be on the host.
host_left="$("$PY" -c 'import json; from testbed.network.cleanup import leftovers; l = {k: v for k, v in leftovers().items() if v}; print(json.dumps(l) if l else "")')"
[ -z "$host_left" ] || fail "testbed objects on the host after destroy: $host_left"
say "total $(( $(date +%s) - t0 )) s; $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
