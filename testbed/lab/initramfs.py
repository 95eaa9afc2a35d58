"""The lab's initramfs: static busybox, the 9p/virtio modules and ``/init``.

Why so small: the initramfs only has to reach the host's root filesystem over
9p.  Everything after that (kmod, iproute2, Python, the testbed) comes from the
host itself, read-only, so the lab always runs the code in the working tree
without copying it.  The per-run work lives in a ``stage2.sh`` the host writes
into the control share; ``/init`` stays fixed, which keeps the cached image
valid across runs.

The image is an uncompressed ``newc`` cpio written here in Python (QEMU loads
it straight into guest memory, so compressing would only cost decompression
time under TCG).  It is cached under ``<cache>/initramfs/<kver>-<hash>.cpio``;
the hash covers the init script, the module files and the busybox binary, so
any change to them builds a new image.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from testbed.lab.errors import QemuMissing
from testbed.lab.kernel import KernelTree, show_depends

#: What ``/init`` needs to mount the control and root shares.
BOOT_MODULES = ["virtio_pci", "9pnet_virtio", "9p"]
#: Busybox applets ``/init`` uses (symlinked in the image).
APPLETS = ["sh", "mount", "mkdir", "insmod", "cat", "chroot", "reboot", "sync", "echo", "sleep"]
#: 9p mount options: 9P2000.L with a large message size (fewer round trips).
P9_OPTS = "trans=virtio,version=9p2000.L,msize=512000"

# ``/init`` runs as PID 1.  It must never exit (that panics the kernel), so
# every path ends in ``reboot -f``, which QEMU (-no-reboot) turns into exit.
# Messages go to the kernel console (ttyS0), which the host keeps as the
# console log and shows when something fails.
INIT_SCRIPT = r"""#!/bin/sh
export PATH=/bin
fail() {
    echo "geo-lab-init: $*" > /dev/console
    echo "GEO-LAB-INIT-FAILED: $*" > /dev/ttyS1
    sync
    reboot -f
    sleep 30
}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo 1 > /proc/sys/kernel/printk
while read -r mod opts; do
    insmod "$mod" $opts || fail "insmod $mod failed"
done < /modules.list
mount -t 9p -o @P9@ labctl /ctl || fail "cannot mount the control share"
CTL=$(cat /ctl/path)
ROOTOPTS=$(cat /ctl/rootopts)
mount -t 9p -o @P9@,ro,$ROOTOPTS host /newroot || fail "cannot mount the host root over 9p"
mount -t proc proc /newroot/proc || fail "mount proc"
mount -t sysfs sysfs /newroot/sys || fail "mount sysfs"
mount -t devtmpfs devtmpfs /newroot/dev || fail "mount devtmpfs"
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /newroot/dev/pts || fail "mount devpts"
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm || fail "mount /dev/shm"
for d in /tmp /run /var/tmp; do
    mount -t tmpfs -o mode=1777 tmpfs /newroot$d || fail "mount tmpfs on $d"
done
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup 2> /dev/null
mkdir -p /newroot$CTL
mount --move /ctl /newroot$CTL || fail "cannot move the control share to $CTL"
# mount --move, not a bare chroot: Mininet runs host processes with `mnexec -a`, which joins
# the host shell's mount namespace and would escape a chroot (then no host path resolves)
cd /newroot && mount --move . / && chroot . /bin/sh "$CTL/stage2.sh"
sync
reboot -f
sleep 30
""".replace("@P9@", P9_OPTS)


def _newc_entry(name: str, mode: int, data: bytes = b"", ino: int = 0, rdev: tuple[int, int] = (0, 0)) -> bytes:
    """One ``newc`` cpio record (header, name, data, each padded to 4 bytes)."""
    namez = name.encode() + b"\0"
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(namez), 0]
    header = b"070701" + b"".join(f"{f:08x}".encode() for f in fields)
    rec = header + namez
    rec += b"\0" * (-len(rec) % 4)
    rec += data + b"\0" * (-len(data) % 4)
    return rec


def _busybox() -> Path:
    """The static busybox the image is built from (busybox-static package)."""
    for cand in ("/bin/busybox", "/usr/bin/busybox"):
        if os.access(cand, os.X_OK):
            return Path(cand)
    found = shutil.which("busybox")
    if found is None:
        raise QemuMissing("busybox not found; the lab initramfs needs a static busybox",
                          "sudo scripts/bootstrap.sh (it installs busybox-static)")
    return Path(found)


def build_initramfs(tree: KernelTree, cache: Path) -> Path:
    """Return the cached initramfs for ``tree``, building it if needed."""
    busybox = _busybox()
    mods = show_depends(tree, BOOT_MODULES)
    h = hashlib.sha256(INIT_SCRIPT.encode())
    h.update(busybox.read_bytes())
    blobs: list[tuple[str, bytes, str]] = []
    for path, opts in mods:
        data = Path(path).read_bytes()
        h.update(path.encode() + opts.encode() + data)
        blobs.append((f"lib/modules/{Path(path).name}", data, opts))
    out = cache / "initramfs" / f"{tree.kver}-{h.hexdigest()[:16]}.cpio"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    entries: list[bytes] = []
    ino = 1

    def add(name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        nonlocal ino
        entries.append(_newc_entry(name, mode, data, ino, rdev))
        ino += 1

    for d in ("bin", "dev", "proc", "sys", "ctl", "newroot", "tmp", "lib", "lib/modules"):
        add(d, 0o040755)
    # The kernel opens /dev/console for init's stdio before /init can mount devtmpfs.
    add("dev/console", 0o020600, rdev=(5, 1))
    add("bin/busybox", 0o100755, busybox.read_bytes())
    for applet in APPLETS:
        add(f"bin/{applet}", 0o120777, b"busybox")
    add("init", 0o100755, INIT_SCRIPT.encode())
    listing = "".join(f"/{name} {opts}\n" for name, _data, opts in blobs)
    add("modules.list", 0o100644, listing.encode())
    for name, data, _opts in blobs:
        add(name, 0o100644, data)
    entries.append(_newc_entry("TRAILER!!!", 0))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            for e in entries:
                fh.write(e)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
