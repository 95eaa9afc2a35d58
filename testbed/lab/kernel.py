"""Obtain a stock distribution kernel for the lab, without installing it.

Why: the development and CI machines run a kernel without ``sch_netem``.  The
distribution's own kernel package has it (and every other module the testbed
uses), so the lab downloads that package with the OS package manager, unpacks
it into a cache and boots it under QEMU.  It is never installed as the host's
kernel: ``apt-get download`` + ``dpkg-deb -x`` only write into the cache.

Layout of the cache (``cache_root()``)::

    kernels/<package>/boot/vmlinuz-<kver>
    kernels/<package>/lib/modules/<kver>/...   (depmod -b already run)
    kernels/<package>/.complete                 (written last: the tree is usable)
    initramfs/<kver>-<hash>.cpio                (see initramfs.py)

A lock file serialises concurrent builders; trees are unpacked beside their
final place and renamed, so a crash never leaves a half tree that looks done.
"""

from __future__ import annotations

import fcntl
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testbed.lab.errors import KernelUnavailable

Log = Callable[[str], None]

#: Meta packages that depend on the distribution's current kernel image.
META_PACKAGES = ("linux-image-amd64", "linux-image-generic")
DEFAULT_CACHE = Path("/var/cache/geo-testbed/lab")
_XZ, _GZIP, _ZSTD = b"\xfd7zXZ\x00", b"\x1f\x8b\x08", b"\x28\xb5\x2f\xfd"
_IMAGE_RE = re.compile(r"^linux-image-(unsigned-)?(?P<kver>\d[\w.+~-]*)$")


def _quiet(_msg: str) -> None:
    """Default logger: say nothing."""


def cache_root() -> Path:
    """Where kernels and initramfs images are cached.

    ``GEO_TESTBED_LAB_CACHE`` wins; root uses ``/var/cache/geo-testbed/lab``;
    anyone else gets ``~/.cache/geo-testbed/lab`` (they cannot write /var/cache).
    """
    env = os.environ.get("GEO_TESTBED_LAB_CACHE")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return DEFAULT_CACHE
    return Path.home() / ".cache" / "geo-testbed" / "lab"


@dataclass(frozen=True)
class KernelTree:
    """An unpacked kernel package: the image to boot and its module tree."""

    package: str
    kver: str
    root: Path

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.kver}"

    @property
    def vmlinux(self) -> Path:
        """The uncompressed kernel, when it could be made (see :func:`ensure_vmlinux`)."""
        return self.root / "boot" / f"vmlinux-{self.kver}"

    @property
    def boot_image(self) -> Path:
        """What QEMU boots: the uncompressed ELF if present, else the bzImage."""
        return self.vmlinux if self.vmlinux.is_file() else self.vmlinuz

    @property
    def modules_dir(self) -> Path:
        return self.root / "lib" / "modules" / self.kver


@contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """Hold the cache lock, so two labs starting at once do not unpack twice."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def find_tool(name: str) -> str | None:
    """``shutil.which`` that also looks in the sbin directories.

    kmod's tools live in /usr/sbin, which a non-root PATH often lacks.
    """
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    tool = find_tool(argv[0]) or argv[0]
    return subprocess.run([tool, *argv[1:]], cwd=cwd, capture_output=True, text=True, check=False)


def resolve_package(meta: tuple[str, ...] = META_PACKAGES) -> str:
    """The concrete ``linux-image-<kver>`` package a meta package points at.

    Why through the meta package: it tracks the distribution's current kernel,
    so security updates reach the lab the way they reach a normal install.
    """
    if shutil.which("apt-cache") is None:
        raise KernelUnavailable(
            "apt-cache not found: the lab gets its kernel from the Debian/Ubuntu package archive",
            "run the lab on Debian/Ubuntu, or set GEO_TESTBED_LAB_KERNEL_PACKAGE and a cache "
            "that already holds the kernel (GEO_TESTBED_LAB_CACHE)",
        )
    tried = []
    for name in meta:
        proc = _run(["apt-cache", "depends", "--important", name])
        tried.append(name)
        if proc.returncode != 0:
            continue
        for line in proc.stdout.splitlines():
            key, _, value = line.strip().partition(":")
            value = value.strip()
            if key.strip().endswith("Depends") and _IMAGE_RE.match(value):
                return value
    raise KernelUnavailable(
        f"no kernel image package found behind {', '.join(tried)}",
        "run 'apt-get update' so apt knows the archive's kernel, or set "
        "GEO_TESTBED_LAB_KERNEL_PACKAGE=linux-image-<version>-amd64",
    )


def _companions(package: str) -> list[str]:
    """Extra packages holding modules for the same kernel (Ubuntu splits them).

    Debian's ``linux-image-*`` carries every module; Ubuntu puts them into
    ``linux-modules-<kver>`` and ``linux-modules-extra-<kver>``.
    """
    m = _IMAGE_RE.match(package)
    if not m:
        return []
    kver = m.group("kver")
    found = []
    for name in (f"linux-modules-{kver}", f"linux-modules-extra-{kver}"):
        proc = _run(["apt-cache", "show", "--no-all-versions", name])
        if proc.returncode == 0 and proc.stdout.strip():
            found.append(name)
    return found


def _download(packages: list[str], into: Path, log: Log) -> list[Path]:
    """``apt-get download`` the packages into ``into``; raise with apt's words on failure."""
    argv = ["apt-get", "download", "-q"]
    if os.geteuid() == 0:
        # apt drops to the _apt user for downloads, which cannot write into a
        # private cache directory; root downloading as root is what we want.
        argv += ["-o", "APT::Sandbox::User=root"]
    log(f"downloading {' '.join(packages)} (once; cached afterwards)")
    proc = _run([*argv, *packages], cwd=into)
    debs = sorted(into.glob("*.deb"))
    if proc.returncode != 0 or not debs:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise KernelUnavailable(
            f"could not download kernel package {packages[0]}: {' | '.join(tail) or 'no .deb'}",
            "check network access to the package archive and run 'apt-get update'",
        )
    return debs


def _unpack(debs: list[Path], dest: Path) -> str:
    """Extract the packages into ``dest`` and run ``depmod -b``; return the kernel version."""
    for deb in debs:
        proc = _run(["dpkg-deb", "-x", str(deb), str(dest)])
        if proc.returncode != 0:
            raise KernelUnavailable(f"dpkg-deb could not extract {deb.name}: {proc.stderr.strip()}")
    # Newer packages ship /usr/lib/modules only (merged /usr); depmod -b and
    # modprobe -d look under <root>/lib/modules.
    if not (dest / "lib").exists() and (dest / "usr" / "lib" / "modules").is_dir():
        (dest / "lib").symlink_to("usr/lib")
    mods = dest / "lib" / "modules"
    kvers = sorted(p.name for p in mods.iterdir()) if mods.is_dir() else []
    if len(kvers) != 1:
        raise KernelUnavailable(f"expected one module tree in the kernel package, found {kvers}")
    kver = kvers[0]
    if not (dest / "boot" / f"vmlinuz-{kver}").is_file():
        raise KernelUnavailable(f"the kernel package has no boot/vmlinuz-{kver}")
    if find_tool("depmod") is None:
        raise KernelUnavailable("depmod not found", "sudo scripts/bootstrap.sh (it installs kmod)")
    proc = _run(["depmod", "-b", str(dest), kver])
    if proc.returncode != 0:
        raise KernelUnavailable(f"depmod failed on the unpacked kernel: {proc.stderr.strip()}")
    return kver


def _decompress(payload: bytes, magic: bytes) -> bytes | None:
    if magic == _XZ:
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
    if magic == _GZIP:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(payload)
    zstd = find_tool("zstd")
    if magic == _ZSTD and zstd:
        proc = subprocess.run([zstd, "-dcq"], input=payload, capture_output=True, check=False)
        # zstd complains about the bzImage's trailing bytes but has written the frame.
        return proc.stdout or None
    return None


def ensure_vmlinux(tree: KernelTree) -> Path:
    """Unpack the ELF kernel from the bzImage once, so QEMU can boot it via PVH.

    Why: under TCG the kernel's own decompressor (xz on Debian) costs several
    seconds of every boot, more on a loaded machine (3-8 s measured here).  An
    uncompressed ELF with a PVH entry note boots without it.  Kernels without
    ``CONFIG_PVH`` or with a payload we cannot decompress keep the bzImage.
    """
    if tree.vmlinux.is_file() or (tree.root / ".no-vmlinux").exists():
        return tree.boot_image
    config = tree.root / "boot" / f"config-{tree.kver}"
    elf = None
    if config.is_file() and "CONFIG_PVH=y" in config.read_text(errors="replace").splitlines():
        image = tree.vmlinuz.read_bytes()
        for magic in (_XZ, _GZIP, _ZSTD):
            at = image.find(magic)
            if at >= 0:
                try:
                    elf = _decompress(image[at:], magic)
                except (lzma.LZMAError, zlib.error):
                    elf = None
                if elf and elf.startswith(b"\x7fELF"):
                    break
                elf = None
    if elf is None:
        (tree.root / ".no-vmlinux").touch()
        return tree.vmlinuz
    tmp = tree.vmlinux.with_name(tree.vmlinux.name + ".tmp")
    tmp.write_bytes(elf)
    tmp.rename(tree.vmlinux)
    return tree.vmlinux


def _tree_at(package: str, root: Path) -> KernelTree | None:
    """The cached tree for ``package`` if it was completely unpacked."""
    marker = root / ".complete"
    if not marker.is_file():
        return None
    kver = marker.read_text().strip()
    tree = KernelTree(package, kver, root)
    return tree if tree.vmlinuz.is_file() else None


def cached_trees(cache: Path) -> list[KernelTree]:
    """Every complete kernel tree in the cache, newest first."""
    base = cache / "kernels"
    if not base.is_dir():
        return []
    trees = [t for p in base.iterdir() if (t := _tree_at(p.name, p)) is not None]
    return sorted(trees, key=lambda t: (t.root / ".complete").stat().st_mtime, reverse=True)


def ensure_kernel(cache: Path | None = None, package: str | None = None, log: Log = _quiet) -> KernelTree:
    """Return an unpacked, depmod'ed kernel tree, downloading it the first time.

    ``package`` (or ``GEO_TESTBED_LAB_KERNEL_PACKAGE``) pins the image package;
    otherwise the distribution's meta package decides.  When the archive cannot
    be reached but an older kernel is cached, that one is used with a warning:
    a lab that worked yesterday keeps working offline.
    """
    cache = cache or cache_root()
    package = package or os.environ.get("GEO_TESTBED_LAB_KERNEL_PACKAGE") or None
    with _locked(cache):
        try:
            name = package or resolve_package()
        except KernelUnavailable:
            fallback = cached_trees(cache)
            if not fallback:
                raise
            log(f"warning: cannot resolve the current kernel package; using cached {fallback[0].package}")
            return fallback[0]
        final = cache / "kernels" / name
        tree = _tree_at(name, final)
        if tree is not None:
            ensure_vmlinux(tree)
            return tree
        final.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=final.parent))
        try:
            debs_dir = work / "debs"
            debs_dir.mkdir()
            unpacked = work / "tree"
            unpacked.mkdir()
            try:
                debs = _download([name, *_companions(name)], debs_dir, log)
            except KernelUnavailable:
                fallback = [t for t in cached_trees(cache) if t.package != name]
                if package or not fallback:
                    raise
                log(f"warning: cannot download {name}; using cached {fallback[0].package}")
                return fallback[0]
            log(f"unpacking {', '.join(d.name for d in debs)}")
            kver = _unpack(debs, unpacked)
            (unpacked / ".complete").write_text(kver + "\n")
            if final.exists():
                shutil.rmtree(final)
            unpacked.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        tree = _tree_at(name, final)
        assert tree is not None
        ensure_vmlinux(tree)
        log(f"kernel {tree.kver} ready in {final}")
        return tree


def show_depends(tree: KernelTree, modules: list[str]) -> list[tuple[str, str]]:
    """Module files (and their options) to load, in order, for ``modules``.

    Uses the host's kmod against the unpacked tree (``modprobe -d``), so the
    initramfs does not need its own dependency resolver.  Built-in modules are
    skipped.  Returns ``[(path, options), ...]`` without duplicates.
    """
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for mod in modules:
        proc = _run(["modprobe", "-d", str(tree.root), "-S", tree.kver, "--show-depends", mod])
        if proc.returncode != 0:
            raise KernelUnavailable(
                f"kernel {tree.kver} has no module {mod}: {proc.stderr.strip()}",
                "use a kernel package that ships it (GEO_TESTBED_LAB_KERNEL_PACKAGE)",
            )
        for line in proc.stdout.splitlines():
            parts = line.split(maxsplit=2)
            if len(parts) >= 2 and parts[0] == "insmod" and parts[1] not in seen:
                seen.add(parts[1])
                out.append((parts[1], parts[2] if len(parts) > 2 else ""))
    return out


def stderr_log(msg: str) -> None:
    """Logger used by the CLI: one ``lab:`` line per step on stderr."""
    print(f"lab: {msg}", file=sys.stderr, flush=True)
