"""The Vagrant Docker provider's box image: the trainer image plus what ``vagrant up`` needs of a machine.

Vagrant's Docker provider cannot pull an image here (no image registry), so
its image comes from the same builder as the container hosts'
(:func:`testbed.images.builder.build`), with one layer on top (``docker build
--network host``, a generated Dockerfile):

* ``openssh-server``, ``sudo`` and ``make`` from the Debian mirror, and a
  ``vagrant`` user with password-less sudo that accepts Vagrant's own
  insecure public key (taken from the Vagrant installation; Vagrant replaces
  it with a fresh key on the first ``vagrant up``), ``sshd`` as the command;
* the host's pip trust: when the host's pip names a CA bundle
  (:func:`host_pip_cert`, as on machines behind a TLS-inspecting proxy),
  that bundle is copied in and named in ``/etc/pip.conf``, so the
  bootstrap inside reaches the package index exactly as the host's does.

Everything else (the apt packages, the venv, the project) is installed by
the bootstrap the box is provisioned with, as on every other path.  The image
is tagged ``geo-testbed/vagrant-box:<hash>`` (trainer image id, Dockerfile,
key, CA bundle) and ``:latest``, and reused while the hash holds; a new
recipe's build removes the box image ``:latest`` named before.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..network.docker_hosts import LABEL, image_id
from .builder import (
    ImageBuildError,
    build,
    built_id,
    new_work,
    owned,
    remove_work,
    tag_as,
)

#: The box image's name (the Vagrantfile's docker provider uses it).
BOX_IMAGE = "geo-testbed/vagrant-box:latest"
#: Where Vagrant installations keep the insecure public key (Debian's package, HashiCorp's).
VAGRANT_KEYS = ("/usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub",
                "/opt/vagrant/embedded/gems/gems/vagrant-*/keys/vagrant.pub",
                "/opt/vagrant/embedded/gems/*/gems/vagrant-*/keys/vagrant.pub")
PACKAGES = ("openssh-server", "sudo", "make")


def vagrant_public_key() -> Path:
    for pattern in VAGRANT_KEYS:
        hits = sorted(glob.glob(pattern))
        if hits:
            return Path(hits[-1])
    raise ImageBuildError("Vagrant's insecure public key was not found (is vagrant installed? fix: "
                          "sudo WITH_VAGRANT=1 scripts/bootstrap.sh)")


def host_pip_cert(python: str = sys.executable) -> Path | None:
    """The CA bundle the host's pip trusts, when it names one that exists: ``PIP_CERT``, else ``cert`` in pip's
    configuration (``pip config list``: files and environment, any section), else ``REQUESTS_CA_BUNDLE``."""
    names = [os.environ.get("PIP_CERT", "")]
    try:
        r = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=30)
        for line in r.stdout.splitlines() if r.returncode == 0 else []:
            key, _, value = line.partition("=")
            if key.rsplit(".", 1)[-1] == "cert":
                names.append(value.strip().strip("'\""))
    except (OSError, subprocess.TimeoutExpired):
        pass
    names.append(os.environ.get("REQUESTS_CA_BUNDLE", ""))
    return next((Path(n) for n in names if n and Path(n).is_file()), None)


def dockerfile(base: str, with_cert: bool) -> str:
    lines = [
        f"FROM {base}",
        "RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
        f"{' '.join(PACKAGES)} && rm -rf /var/lib/apt/lists/*",
        "RUN useradd --create-home --shell /bin/bash vagrant"
        " && echo 'vagrant ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/vagrant && chmod 440 /etc/sudoers.d/vagrant"
        " && mkdir -p /home/vagrant/.ssh /run/sshd",
        "COPY vagrant.pub /home/vagrant/.ssh/authorized_keys",
        "RUN chown -R vagrant:vagrant /home/vagrant/.ssh && chmod 700 /home/vagrant/.ssh"
        " && chmod 600 /home/vagrant/.ssh/authorized_keys",
    ]
    if with_cert:
        lines += ["COPY host-pip-ca.crt /etc/ssl/host-pip-ca.crt",
                  r"RUN printf '[global]\ncert = /etc/ssl/host-pip-ca.crt\n' > /etc/pip.conf"]
    lines += [f"LABEL {LABEL}.image=vagrant-box", "EXPOSE 22", 'CMD ["/usr/sbin/sshd", "-D", "-e"]']
    return "\n".join(lines) + "\n"


def build_box(*, rebuild: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build (or reuse) the box image on top of the trainer image; returns its tag and id."""
    trainer = build(log=log)
    key, cert = vagrant_public_key(), host_pip_cert()
    text = dockerfile(trainer["tag"], cert is not None)
    h = hashlib.sha256()
    for part in (trainer["id"].encode(), text.encode(), key.read_bytes(), cert.read_bytes() if cert else b""):
        h.update(hashlib.sha256(part).digest())
    tag = f"{BOX_IMAGE.rsplit(':', 1)[0]}:{h.hexdigest()[:16]}"
    cached = image_id(tag)
    if cached and not rebuild:
        subprocess.run(["docker", "tag", tag, BOX_IMAGE], check=False, capture_output=True)
        log(f"box {tag}: cached ({cached[:19]}); tagged {BOX_IMAGE}")
        return {"tag": tag, "name": BOX_IMAGE, "id": cached, "cached": True, "trainer": trainer["tag"]}
    work = new_work()
    t0 = time.monotonic()
    try:
        ctx = work / "context"
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(text)
        shutil.copyfile(key, ctx / "vagrant.pub")
        if cert is not None:
            shutil.copyfile(cert, ctx / "host-pip-ca.crt")
        log(f"box: docker build on {trainer['tag']} ({', '.join(PACKAGES)}, user vagrant"
            f"{', the host pip CA bundle ' + str(cert) if cert else ''}) ...")
        r = subprocess.run(["docker", "build", "--network", "host", "--quiet", "--tag", tag, str(ctx)],
                           capture_output=True, text=True, env=owned(), timeout=1800)
        if r.returncode != 0:
            raise ImageBuildError(f"docker build of the box failed: {(r.stderr or r.stdout).strip()[-800:]} "
                                  "(fix: check that the Debian mirror is reachable: apt-get update)")
        # the box :latest named before (an older recipe: derived, rebuilt in seconds) goes with this build
        tag_as(tag, BOX_IMAGE, replaced=cached or image_id(BOX_IMAGE))
    finally:
        remove_work(work)
    iid = built_id(tag)
    log(f"box {tag} ({iid[:19]}) built in {time.monotonic() - t0:.0f} s; tagged {BOX_IMAGE}")
    return {"tag": tag, "name": BOX_IMAGE, "id": iid, "cached": False, "trainer": trainer["tag"]}
