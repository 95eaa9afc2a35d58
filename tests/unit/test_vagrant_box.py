"""The Vagrant lab's pieces that run without bringing it up (scripts/vagrant-docker-check.sh brings it up in
CI): the docker provider's image recipe, the host trust it carries, the provisioning's venv and netem rules."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testbed.images import box
from testbed.images.builder import ImageBuildError

REPO = Path(__file__).resolve().parents[2]


def test_the_box_layer_adds_sshd_a_vagrant_user_and_nothing_from_a_registry():
    text = box.dockerfile("geo-testbed/trainer:abc", with_cert=False)
    assert text.startswith("FROM geo-testbed/trainer:abc\n")  # the trainer image the builder made, by its hash
    assert "openssh-server" in text and "useradd --create-home --shell /bin/bash vagrant" in text
    assert "NOPASSWD:ALL" in text and 'CMD ["/usr/sbin/sshd", "-D", "-e"]' in text
    assert "pip.conf" not in text
    with_cert = box.dockerfile("t", with_cert=True)
    assert "COPY host-pip-ca.crt /etc/ssl/host-pip-ca.crt" in with_cert
    assert "cert = /etc/ssl/host-pip-ca.crt" in with_cert


def test_the_host_pip_trust_is_found_where_pip_reads_it(tmp_path, monkeypatch):
    bundle = tmp_path / "ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("PIP_CERT", str(bundle))
    assert box.host_pip_cert() == bundle
    # pip's configuration, any section (what `pip config list` prints); names that do not exist are skipped
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "missing.crt"))
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    listing = f"global.find-links='/opt/wheels'\n:env:.cert='{tmp_path / 'gone.crt'}'\ninstall.cert='{bundle}'\n"
    real_run = subprocess.run

    def fake_run(argv, **kw):
        if argv[1:4] == ["-m", "pip", "config"]:
            return subprocess.CompletedProcess(argv, 0, listing, "")
        return real_run(argv, **kw)

    monkeypatch.setattr(box.subprocess, "run", fake_run)
    assert box.host_pip_cert() == bundle
    listing = "global.find-links='/opt/wheels'\n"
    assert box.host_pip_cert() is None


def test_a_missing_vagrant_installation_is_named_with_the_fix(monkeypatch):
    monkeypatch.setattr(box, "VAGRANT_KEYS", ("/nonexistent/vagrant-*/keys/vagrant.pub",))
    with pytest.raises(ImageBuildError, match="WITH_VAGRANT=1"):
        box.vagrant_public_key()


def test_the_makefile_takes_the_lab_machines_venv_and_an_explicit_one_wins(tmp_path):
    """The lab's venv stays inside the machine: provisioning names it in /etc/geo-testbed/venv (read here
    through a copy of the Makefile whose path is redirected), and `make VENV=...` still overrides."""
    text = (REPO / "Makefile").read_text()
    assert "/etc/geo-testbed/venv" in text
    mk = tmp_path / "Makefile"
    conf = tmp_path / "venv"
    mk.write_text(text.replace("/etc/geo-testbed/venv", str(conf)) + "\nshow:\n\t@echo $(VENV)\n")

    # as a user's shell runs it: not under `make test`, whose make exports VENV and its flags
    env = {k: v for k, v in os.environ.items() if k not in ("VENV", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}

    def venv(*args: str) -> str:
        return subprocess.run(["make", "-s", "-f", str(mk), "show", *args], capture_output=True, text=True,
                              check=True, env=env).stdout.strip()

    assert venv() == ".venv"
    conf.write_text("/opt/testbed-venv\n")
    assert venv() == "/opt/testbed-venv"
    assert venv("VENV=/x") == "/x"


def test_provisioning_fails_loudly_in_a_vm_without_netem_and_links_nothing_into_the_checkout():
    text = (REPO / "vagrant" / "provision.sh").read_text()
    assert "|| true" not in text  # no silent fall-back
    assert "exit 1" in text and "ln -s" not in text
    assert "make -C /testbed VENV=\"$VENV\" bootstrap" in text


def test_the_vagrantfile_pins_the_box_and_offers_the_docker_provider():
    text = (REPO / "vagrant" / "Vagrantfile").read_text()
    assert 'config.vm.box_version = BOX_VERSION' in text and 'provider "docker"' in text
    assert '"image", "build", "--vagrant-box"' in text
    assert not (REPO / "vagrant" / ".vagrant").exists() or "vagrant/.vagrant/" in (REPO / ".gitignore").read_text()
