#!/usr/bin/env bash
# One-stop set-up on a fresh Debian/Ubuntu machine, as root.  Idempotent: run
# it again at any time; it installs only what is missing.
#
#   sudo scripts/bootstrap.sh                  # CPU build of torch (default)
#   sudo TORCH_VARIANT=cuda scripts/bootstrap.sh   # CUDA build of torch (GPU servers)
#
# Environment:
#   TORCH_VARIANT   cpu (default) | cuda
#   TORCH_VERSION   default 2.13.0
#   TORCH_INDEX_URL a pip index to take torch from (either variant)
#   TORCH_CPU_INDEX_URL  the CPU variant's index when no local wheel is found,
#                   default https://download.pytorch.org/whl/cpu (PyPI's Linux
#                   torch is the multi-GB CUDA build)
#   WITH_VAGRANT=1  also install Debian's vagrant (CI uses it for `vagrant validate`)
#   WITH_DOCKER=1   also install Debian's docker.io and debootstrap, and start the Docker daemon
#                   (runtime: docker hosts; `testbed image build` makes their image)
#   WITH_CLUSTER=1  also install openssh-server and gcc: the stand-in servers of the several-servers
#                   tests (tests/cluster: each runs its own sshd; one has its clock set off by a
#                   small preload library the tests build, tests/cluster/clockshift.c). On a
#                   systemd machine Debian enables the ssh service when the package is installed.
#   VENV            default .venv in the repository
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
VENV="${VENV:-$here/.venv}"
TORCH_VARIANT="${TORCH_VARIANT:-cpu}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"

log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
  echo "bootstrap must run as root (sudo scripts/bootstrap.sh)" >&2
  exit 2
fi

APT_PACKAGES=(
  mininet iperf3 ethtool iproute2 bridge-utils iputils-ping iptables procps psmisc kmod
  python3-venv python3-dev gcc openssh-client
  libnetfilter-queue1 libnetfilter-queue-dev libnfnetlink-dev
  qemu-system-x86 busybox-static cpio zstd xz-utils
)
if [ "${WITH_VAGRANT:-0}" = 1 ]; then APT_PACKAGES+=(vagrant); fi
if [ "${WITH_DOCKER:-0}" = 1 ]; then APT_PACKAGES+=(docker.io debootstrap); fi
if [ "${WITH_CLUSTER:-0}" = 1 ]; then APT_PACKAGES+=(openssh-server gcc libc6-dev); fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "apt: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "apt: all ${#APT_PACKAGES[@]} packages present"
fi
# The kernel lab downloads a stock kernel package with apt-get download: it needs package lists.
if ! ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 && ! ls /var/lib/apt/lists/*_Packages.* >/dev/null 2>&1; then
  apt-get update -q
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "venv: $VENV (system site-packages, for Debian's mininet)"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q)

# torch: the build TORCH_VARIANT asks for.  PyPI's Linux torch is the multi-GB CUDA build, so the CPU
# variant takes a local wheel when pip's find-links has one (this project's development machines), else
# PyTorch's CPU index; the CUDA variant replaces a CPU build that is already there.  pip shows progress.
case "$TORCH_VARIANT" in
  cpu|cuda) ;;
  *) echo "TORCH_VARIANT must be cpu or cuda, got $TORCH_VARIANT" >&2; exit 2 ;;
esac
TORCH_CPU_INDEX_URL="${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
have="$("$VENV/bin/python" -c 'import torch; print("cuda" if torch.version.cuda else "cpu")' 2>/dev/null || true)"
if [ "$have" != "$TORCH_VARIANT" ]; then
  PIPT=("$VENV/bin/python" -m pip install --progress-bar on)
  if [ "$TORCH_VARIANT" = cpu ]; then
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
      log "torch $TORCH_VERSION (CPU) from $TORCH_INDEX_URL"
      "${PIPT[@]}" --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"
    elif "$VENV/bin/python" -m pip install --dry-run -q --no-deps --no-index --ignore-installed "torch==$TORCH_VERSION" &>/dev/null; then
      log "torch $TORCH_VERSION (CPU: the local wheel pip's find-links has)"
      "${PIPT[@]}" "torch==$TORCH_VERSION"
    else
      log "torch $TORCH_VERSION (CPU) from $TORCH_CPU_INDEX_URL"
      "${PIPT[@]}" --index-url "$TORCH_CPU_INDEX_URL" --extra-index-url https://pypi.org/simple "torch==$TORCH_VERSION"
    fi
  else
    log "torch $TORCH_VERSION (CUDA build from ${TORCH_INDEX_URL:-PyPI})${have:+, replacing the $have build}"
    "${PIPT[@]}" --force-reinstall --no-deps ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$TORCH_VERSION"
    "${PIPT[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$TORCH_VERSION"
  fi
  got="$("$VENV/bin/python" -c 'import torch; print("cuda" if torch.version.cuda else "cpu")' 2>/dev/null || true)"
  if [ "$got" != "$TORCH_VARIANT" ]; then
    echo "torch: asked for the $TORCH_VARIANT build, got '${got:-none}' (fix: set TORCH_INDEX_URL to an index with it)" >&2
    exit 1
  fi
fi

log "project + dev extras (editable)"
"${PIP[@]}" -e ".[dev,tables,nfqueue]"

# The kernel lab's stock kernel (downloaded with apt-get download, extracted, never installed)
# and its initramfs, cached under /var/cache/geo-testbed/lab: `make test` uses it where the
# running kernel has no sch_netem.
if ! "$VENV/bin/python" -m testbed.lab --prepare --quiet; then
  log "kernel lab not prepared now (it retries on first use)"
fi

# Under sudo, the venv and the editable install's metadata belong to the user who typed it
# (who can then pip install into it); only entries still owned by root are changed.
if [ -n "${SUDO_UID:-}" ] && [ "${SUDO_UID}" != 0 ] && [ "$(id -u)" = 0 ]; then
  for p in "$VENV" "$here"/*.egg-info; do
    [ -e "$p" ] && find "$p" -uid 0 -exec chown -h "$SUDO_UID:${SUDO_GID:-$SUDO_UID}" {} + 2>/dev/null || true
  done
fi

# TCP congestion controls the hosts may use.  A network namespace may only pick an algorithm the
# machine allows (net.ipv4.tcp_allowed_congestion_control); hosts run cubic unless a topology says
# otherwise (some machines default to BBR and allow only "reno bbr").  Adding names to the allowed
# list changes no one's default; it is kept across reboots in /etc/sysctl.d.
modprobe tcp_bbr 2>/dev/null || true  # where BBR is a module (Debian's kernels); built in elsewhere
allowed="$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control 2>/dev/null || true)"
want="$allowed"
for cc in cubic bbr; do
  if grep -qw "$cc" /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null && ! grep -qw "$cc" <<<"$want"; then
    want="$want $cc"
  fi
done
if [ "$want" != "$allowed" ]; then
  log "tcp: allowing congestion controls '$want' in network namespaces (was '$allowed')"
  sysctl -qw net.ipv4.tcp_allowed_congestion_control="$want"
  printf 'net.ipv4.tcp_allowed_congestion_control = %s\n' "$want" > /etc/sysctl.d/90-geo-testbed.conf
fi

# The Docker daemon, when asked for: systemd's unit where systemd runs, else dockerd in the background.
if [ "${WITH_DOCKER:-0}" = 1 ] && ! docker info >/dev/null 2>&1; then
  if [ -d /run/systemd/system ]; then
    log "docker: systemctl start docker"
    systemctl start docker
  else
    log "docker: starting dockerd (no systemd; log in /var/log/dockerd.log)"
    nohup dockerd >/var/log/dockerd.log 2>&1 &
  fi
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start: see /var/log/dockerd.log" >&2; exit 1; }
fi

# `sudo testbed ...` from anywhere
ln -sf "$VENV/bin/testbed" /usr/local/bin/testbed

log "done: $("$VENV/bin/python" -c 'import torch,sys; print("python", sys.version.split()[0], "torch", torch.__version__)')"
