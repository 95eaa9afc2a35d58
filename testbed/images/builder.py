"""The trainer image, built offline from package registries only (``testbed image build``).

No image is pulled from an image registry.  The recipe:

1. a Debian root filesystem from the distribution's packages (``debootstrap
   --variant=minbase``, with ``python3`` and ``python3-pip``);
2. the project's Python dependencies as wheels, fetched on the host by
   ``pip download`` for the image's Python (so the host's pip configuration,
   mirror or local wheel directory is what serves them: ``TORCH_INDEX_URL``
   as for the bootstrap, PyTorch's CPU wheels by default off this machine),
   then installed inside with ``--no-index``: the image build itself needs no
   network past the Debian mirror;
3. ``docker import`` of the tree, labelled with the recipe's hash.

The recipe's hash (suite, packages, pinned requirements) is the cache key: an
image labelled with it is reused.  The project's own code is *not* in the
image; it is mounted read-only at run time (docker_hosts), so one image
serves every checkout with the same dependencies.  Work files live under
``/var/tmp/geo-testbed-image.*`` and are removed on failure; ``testbed clean``
removes those a killed builder left.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..network import naming
from ..network.docker_hosts import DEFAULT_IMAGE, LABEL, DockerError, image_id

#: Debian release of the image, and the Python it ships (wheels are fetched for that Python).
SUITE, SUITE_PYTHON = "bookworm", "3.11"
#: Debian packages of the image, past minbase.
PACKAGES = ("python3", "python3-pip", "ca-certificates", "procps", "iproute2")
#: Work directories start with this (``testbed clean`` removes the ones a killed builder left).
WORK_PREFIX = "geo-testbed-image."
WORK_ROOT = Path("/var/tmp")
#: The distributions whose wheels pip may take for the image.
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64",
             "linux_x86_64", "any")
#: Of the project's dependencies, those a trainer does not import (figures, tables, console): left out.
NOT_IN_IMAGE = ("matplotlib", "rich")


class ImageBuildError(RuntimeError):
    """A step of the build failed; the message names the step and its fix."""


@dataclass
class Recipe:
    """What goes into the image; its hash names it."""

    requirements: list[str]  # pinned: "name==version"
    suite: str = SUITE
    packages: tuple[str, ...] = PACKAGES
    mirror: str = "http://deb.debian.org/debian"
    extra: dict[str, Any] = field(default_factory=dict)

    def digest(self) -> str:
        body = json.dumps({"suite": self.suite, "packages": list(self.packages), "requirements": self.requirements},
                          sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def tag(self, name: str = DEFAULT_IMAGE) -> str:
        return f"{name.rsplit(':', 1)[0]}:{self.digest()}"


def pinned_requirements() -> list[str]:
    """The project's runtime dependencies at the versions this machine's environment has (so the image's
    trainers run what the host's tests ran), without those only the host uses."""
    from importlib.metadata import PackageNotFoundError, requires, version

    out = []
    for req in requires("geo-testbed") or []:
        if ";" in req:  # extras (dev, tables, nfqueue) are not the trainers'
            continue
        name = req.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip()
        if name.lower() in NOT_IN_IMAGE:
            continue
        try:
            v = version(name)
        except PackageNotFoundError:
            raise ImageBuildError(f"{name} is not installed here; run the bootstrap first "
                                  "(sudo scripts/bootstrap.sh)") from None
        out.append(f"{name}=={v.split('+')[0]}")
    return sorted(out, key=str.lower)


def debian_mirror() -> str:
    """The host's Debian mirror (its apt sources), else deb.debian.org."""
    for src in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            text = src.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1 and "security" not in words[1]:
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2 and "security" not in line:
                return next(w for w in words[1:] if w.startswith("http"))
    return "http://deb.debian.org/debian"


#: Where the CPU build of torch comes from when pip's own configuration has no local wheel of it (PyPI's
#: Linux torch is the multi-GB CUDA build); TORCH_INDEX_URL overrides, as for the bootstrap.
TORCH_CPU_INDEX_URL = "https://download.pytorch.org/whl/cpu"


def torch_source(download: list[str]) -> list[str]:
    """pip options that give the CPU build of torch: TORCH_INDEX_URL if set; else only pip's find-links when
    they hold a wheel of it (a development machine's local wheels: no index is asked); else PyTorch's CPU index."""
    if os.environ.get("TORCH_INDEX_URL"):
        return ["--index-url", os.environ["TORCH_INDEX_URL"]]
    return ["--no-index"] if _find_links_have_torch() else \
        ["--index-url", os.environ.get("TORCH_CPU_INDEX_URL", TORCH_CPU_INDEX_URL)]


def _find_links_have_torch() -> bool:
    links = os.environ.get("PIP_FIND_LINKS", "")
    try:
        r = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True,
                           text=True, timeout=30)
        links += " " + (r.stdout if r.returncode == 0 else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    for d in links.split():
        d = d.removeprefix("file://")
        if Path(d).is_dir() and any(Path(d).glob("torch-*.whl")):
            return True
    return False


def owned(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a build step, marked as the testbed's: `testbed clean` ends the steps (debootstrap,
    pip, tar) of a builder that was killed, before it removes their work tree."""
    return {**(os.environ if env is None else env), naming.OWNER_ENV: naming.PREFIX}


def _run(step: str, argv: list[str], log: Callable[[str], None], fix: str, **kw: Any) -> None:
    t0 = time.monotonic()
    log(f"{step} ...")
    kw["env"] = owned(kw.get("env"))
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise ImageBuildError(f"{step} failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-800:]} "
                              f"(fix: {fix})")
    log(f"{step}: done in {time.monotonic() - t0:.0f} s")


def unmount_under(path: Path) -> list[str]:
    """Unmount everything mounted below ``path`` (debootstrap mounts /proc and /sys in the tree it builds),
    deepest first, so removing the tree can never reach into a mounted file system."""
    root = str(path.resolve()).rstrip("/") + "/"
    points = [line.split()[1].replace("\\040", " ") for line in Path("/proc/self/mounts").read_text().splitlines()]
    points = sorted({p for p in points if p.startswith(root)}, key=len, reverse=True)
    for p in points:
        subprocess.run(["umount", "--lazy", p], capture_output=True)
    return points


def remove_work(work: Path) -> None:
    unmount_under(work)
    shutil.rmtree(work, ignore_errors=True)


def new_work() -> Path:
    """A fresh work directory marked with this builder's pid (the stale ones of dead builders removed
    first), so `testbed clean` can tell a killed build's leftovers from a running one."""
    remove_stale_work()
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=WORK_ROOT))
    (work / "builder.pid").write_text(str(os.getpid()))
    return work


def remove_stale_work() -> list[str]:
    """Work directories of builders that are gone (their pid file names a dead process)."""
    out = []
    for d in WORK_ROOT.glob(WORK_PREFIX + "*"):
        try:
            pid = int((d / "builder.pid").read_text())
            os.kill(pid, 0)
            continue  # a builder still runs
        except (OSError, ValueError):
            pass
        remove_work(d)
        out.append(str(d))
    return out


def build(name: str = DEFAULT_IMAGE, *, rebuild: bool = False, log: Callable[[str], None] = print,
          python: str = sys.executable) -> dict[str, Any]:
    """Build (or find in the cache) the trainer image; returns its tag, id and recipe."""
    from ..network import docker_hosts

    docker_hosts.require()
    recipe = Recipe(pinned_requirements(), mirror=debian_mirror())
    tag = recipe.tag(name)
    cached = image_id(tag)
    if cached and not rebuild:
        subprocess.run(["docker", "tag", tag, name], check=False, capture_output=True)
        log(f"image {tag}: cached ({cached[:19]}); tagged {name}")
        return {"tag": tag, "name": name, "id": cached, "cached": True, "recipe": recipe.requirements}
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is missing (fix: sudo WITH_DOCKER=1 scripts/bootstrap.sh)")
    work = new_work()
    t0 = time.monotonic()
    try:
        rootfs, wheels = work / "rootfs", work / "rootfs" / "tmp" / "wheels"
        _run(f"debootstrap {recipe.suite} ({', '.join(recipe.packages)}) from {recipe.mirror}",
             ["debootstrap", "--variant=minbase", f"--include={','.join(recipe.packages)}", recipe.suite,
              str(rootfs), recipe.mirror], log, "check that the Debian mirror is reachable (apt-get update works)",
             timeout=3600)
        wheels.mkdir(parents=True, exist_ok=True)
        req = wheels / "requirements.txt"
        req.write_text("\n".join(recipe.requirements) + "\n")
        download = [python, "-m", "pip", "download", "--quiet", "--dest", str(wheels), "--only-binary=:all:",
                    "--python-version", SUITE_PYTHON, "--implementation", "cp",
                    *[a for p in PLATFORMS for a in ("--platform", p)]]
        torch_req = next(r for r in recipe.requirements if r.lower().startswith("torch=="))
        _run(f"pip download {torch_req} (CPU build)", download + ["--no-deps", *torch_source(download), torch_req],
             log, "set TORCH_INDEX_URL to a pip index with CPU torch wheels", timeout=3600)
        _run(f"pip download {len(recipe.requirements)} requirements for Python {SUITE_PYTHON}",
             download + ["--find-links", str(wheels), "-r", str(req)],
             log, "the host's pip must reach a package index (its configuration is used)", timeout=3600)
        _run("pip install inside the image (no network)",
             ["chroot", str(rootfs), "python3", "-m", "pip", "install", "--quiet", "--no-index", "--no-cache-dir",
              "--break-system-packages", "--find-links", "/tmp/wheels", "-r", "/tmp/wheels/requirements.txt"],
             log, "see pip's message above", timeout=3600, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                                                 "HOME": "/root", "LANG": "C.UTF-8"})
        shutil.rmtree(wheels)
        unmount_under(rootfs)  # nothing of the host's may go into the image
        for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (rootfs / d).glob("*.deb" if "archives" in d else "*_*"):
                f.unlink(missing_ok=True)
        log("docker import ...")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "--one-file-system", "-c", "."],
                               stdout=subprocess.PIPE, env=owned())
        imp = subprocess.run(["docker", "import", "--message", f"geo-testbed trainer image, recipe {recipe.digest()}",
                              "--change", f"LABEL {LABEL}.recipe={recipe.digest()}",
                              "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                              "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]', "-", tag],
                             stdin=tar.stdout, capture_output=True, text=True, env=owned())
        tar.stdout.close()  # type: ignore[union-attr]
        if tar.wait() != 0 or imp.returncode != 0:
            raise ImageBuildError(f"docker import failed: {imp.stderr.strip()[-500:]} (fix: is there disk space? "
                                  "docker system df)")
        tag_as(tag, name, replaced=cached)
    finally:
        remove_work(work)
    iid = built_id(tag)
    log(f"image {tag} ({iid[:19]}) built in {time.monotonic() - t0:.0f} s; tagged {name}")
    return {"tag": tag, "name": name, "id": iid, "cached": False, "recipe": recipe.requirements}


def tag_as(tag: str, name: str, replaced: str | None = None) -> None:
    """Point ``name`` (``...:latest``) at the image just built as ``tag``, and remove the image that build
    replaced (a rebuild of the same recipe: now untagged), so no stale layer is left behind."""
    subprocess.run(["docker", "tag", tag, name], check=True, capture_output=True)
    if replaced and replaced != image_id(tag):
        subprocess.run(["docker", "image", "rm", replaced], capture_output=True)


def built_id(tag: str) -> str:
    """The id of the image a build step just made (an error when the daemon does not have it)."""
    iid = image_id(tag)
    if iid is None:
        raise DockerError(f"image {tag} is not in the daemon after its build")
    return iid


def check_image(image: str) -> dict[str, Any]:
    """What ``image`` runs a trainer with: its python3 and torch (an error naming what lacks, else versions)."""
    from ..network.docker_hosts import VERSION_PROBE

    r = subprocess.run(["docker", "run", "--rm", "--network", "none", "--label", f"{LABEL}=tb", "--entrypoint",
                        "python3", image, "-c", VERSION_PROBE], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise DockerError(f"image {image!r} cannot run a trainer: python3 -c 'import torch, numpy' said "
                          f"{(r.stderr or r.stdout).strip()[-300:]} (fix: an image with Python 3 and torch, "
                          "e.g. `testbed image build`)")
    return json.loads(r.stdout.strip().splitlines()[-1])
