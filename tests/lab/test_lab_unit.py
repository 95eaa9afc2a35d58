"""Fast checks of the kernel lab's parts; nothing here boots a VM.

Why: booting costs seconds of a shared CPU, so the protocol pieces (marker
splitting, quoting, environment, validation, fault messages) are pinned here
and the boot tests in test_lab_boot.py only check the whole.
"""

from __future__ import annotations

import argparse
import gzip
import io
import lzma
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.lab import cli, kernel, vm
from testbed.lab.errors import GuestPanic, KernelUnavailable, QemuMissing
from testbed.lab.guest import Share, guest_env, masked_by_tmpfs, stage2_script
from testbed.lab.initramfs import _newc_entry
from testbed.lab.kernel import KernelTree, ensure_kernel, ensure_vmlinux, find_tool
from testbed.lab.stream import ConsoleSplitter
from traffic_control.errors import ValidationError

TOKEN = "abc123"
STREAM = (b"init noise\r\nGEO-LAB-READY abc123\nhello\nGEO-LAB-DONE almost\nworld"
          b"GEO-LAB-DONE abc123 7\n")


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_splitter_separates_output_from_markers(size: int) -> None:
    sink = io.BytesIO()
    sp = ConsoleSplitter(TOKEN, sink)
    for i in range(0, len(STREAM), size):
        sp.feed(STREAM[i:i + size])
    sp.finish()
    assert bytes(sp.output) == b"hello\nGEO-LAB-DONE almost\nworld"
    assert sink.getvalue() == bytes(sp.output)
    assert sp.boot_text.startswith(b"init noise")
    assert sp.done_status == 7
    assert sp.ready_at is not None and sp.done_at is not None


def test_splitter_streams_each_line_at_once() -> None:
    sink = io.BytesIO()
    sp = ConsoleSplitter(TOKEN, sink)
    sp.feed(b"GEO-LAB-READY abc123\nstarted\n")
    assert sink.getvalue() == b"started\n"  # nothing held back waiting for a marker
    sp.feed(b"no newline G")
    assert sink.getvalue() == b"started\nno newline "  # only a possible marker prefix waits
    sp.feed(b"oes on\nGEO-LAB-DONE abc123 0\n")
    assert bytes(sp.output) == b"started\nno newline Goes on\n" and sp.done_status == 0


def test_splitter_keeps_boot_text_when_never_ready() -> None:
    sp = ConsoleSplitter(TOKEN)
    sp.feed(b"GEO-LAB-INIT-FAILED: cannot mount\n")
    sp.finish()
    assert sp.ready_at is None and not sp.output
    assert b"cannot mount" in sp.boot_text


def test_splitter_flushes_unterminated_output_on_kill() -> None:
    sp = ConsoleSplitter(TOKEN)
    sp.feed(b"GEO-LAB-READY abc123\nstarted\n")
    sp.finish()
    assert bytes(sp.output) == b"started\n"
    assert sp.done_at is None


def test_stage2_quotes_every_argument() -> None:
    nasty = ["sh", "-c", "echo $(reboot) 'x' \"y\"; exit 3", "a b"]
    script = stage2_script(ctl=Path("/tmp/geo-lab-x"), token=TOKEN, argv=nasty, cwd=Path("/w d"),
                           env={"A": "1 $B"}, shares=[Share("share0", Path("/tmp/s p"))],
                           tree_root=Path("/cache/k"), modules=["sch_netem"], keep_going=False)
    exec_line = next(ln for ln in script.splitlines() if "exec env -i" in ln)
    words = shlex.split(exec_line.split("exec env -i", 1)[1].split(" ) <")[0])
    assert words == ["A=1 $B", *nasty]
    assert "cd -- '/w d'" in script
    assert "'/tmp/s p'" in script
    assert "modules.rc" in script and 'abort "some kernel modules' in script


def test_stage2_keep_going_does_not_abort_on_modules() -> None:
    script = stage2_script(ctl=Path("/c"), token=TOKEN, argv=["true"], cwd=Path("/"), env={},
                           shares=[], tree_root=Path("/k"), modules=["x"], keep_going=True)
    assert 'abort "some kernel modules' not in script


def test_guest_env_passes_essentials_only() -> None:
    src = {"PATH": "/p", "VIRTUAL_ENV": "/v", "SSH_AUTH_SOCK": "/s", "GEO_TESTBED_X": "1",
           "DISPLAY": ":0", "PYTEST_ADDOPTS": "-q"}
    env = guest_env(Path("/tmp/geo-lab-x"), {"MINE": "2", "TERM": "xterm"}, source=src)
    assert env["PATH"] == "/p" and env["VIRTUAL_ENV"] == "/v" and env["GEO_TESTBED_X"] == "1"
    assert env["PYTEST_ADDOPTS"] == "-q"
    assert "SSH_AUTH_SOCK" not in env and "DISPLAY" not in env
    assert env["MINE"] == "2" and env["TERM"] == "xterm"  # the caller's extras win
    assert env["GEO_TESTBED_IN_LAB"] == "1"
    assert env["LAB_OUT"] == "/tmp/geo-lab-x/out"


def test_masked_by_tmpfs() -> None:
    assert masked_by_tmpfs(Path("/tmp/x/y")) and masked_by_tmpfs(Path("/run"))
    assert not masked_by_tmpfs(Path("/work/main")) and not masked_by_tmpfs(Path("/tmpfoo"))


def _parse_newc(blob: bytes) -> list[tuple[str, int, bytes]]:
    """Minimal reader for the check below (name, mode, data)."""
    out, pos = [], 0
    while True:
        assert blob[pos:pos + 6] == b"070701"
        f = [int(blob[pos + 6 + 8 * i: pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = f[1], f[6], f[11]
        pos += 110
        name = blob[pos:pos + namesize - 1].decode()
        pos += namesize + (-(110 + namesize) % 4)
        data = blob[pos:pos + size]
        pos += size + (-size % 4)
        if name == "TRAILER!!!":
            return out
        out.append((name, mode, data))


def test_newc_records_roundtrip() -> None:
    blob = (_newc_entry("init", 0o100755, b"#!/bin/sh\n", 1) + _newc_entry("bin/sh", 0o120777, b"busybox", 2)
            + _newc_entry("dev/console", 0o020600, ino=3, rdev=(5, 1)) + _newc_entry("TRAILER!!!", 0))
    assert len(blob) % 4 == 0
    assert _parse_newc(blob) == [("init", 0o100755, b"#!/bin/sh\n"), ("bin/sh", 0o120777, b"busybox"),
                                 ("dev/console", 0o020600, b"")]


@pytest.mark.parametrize("kwargs, field", [
    ({"timeout": 0}, "timeout"),
    ({"timeout": -5}, "timeout"),
    ({"timeout": 10, "memory_mb": 64}, "memory"),
    ({"timeout": 10, "memory_mb": 2**40}, "memory"),
    ({"timeout": 10, "cpus": 0}, "cpus"),
    ({"timeout": 10, "shares": ["/nonexistent/dir"]}, "shares[0]"),
    ({"timeout": 10, "cwd": "/nonexistent/dir"}, "cwd"),
])
def test_bad_input_is_a_validation_error(kwargs: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        vm.run_in_lab(["true"], **kwargs)
    assert e.value.field == field


def test_empty_command_is_a_validation_error() -> None:
    with pytest.raises(ValidationError):
        vm.run_in_lab([], timeout=10)


def test_missing_qemu_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(vm, "QEMU", "qemu-system-x86_64-not-installed")
    with pytest.raises(QemuMissing, match="not found.*bootstrap.*qemu-system-x86"):
        vm.run_in_lab(["true"], timeout=10)
    ok, why = vm.lab_available()
    assert not ok and "not found" in why


@pytest.mark.skipif(find_tool("apt-get") is None, reason="needs apt-get")
def test_undownloadable_kernel_package_is_reported(tmp_path: Path) -> None:
    with pytest.raises(KernelUnavailable, match="could not download kernel package linux-image-0.0.0"):
        ensure_kernel(tmp_path, package="linux-image-0.0.0-nonexistent-amd64")
    assert not list((tmp_path / "kernels").glob("*/.complete"))


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="testbed")
    cli.register(parser.add_subparsers(dest="subcommand", required=True))
    return parser.parse_args(argv)


def test_cli_parses_command_after_double_dash() -> None:
    args = _parse(["lab", "--timeout", "30", "--cpus", "2", "--keep-going", "--", "tc", "-s", "qdisc"])
    assert args.timeout == 30 and args.cpus == 2 and args.keep_going
    assert args.command[-3:] == ["tc", "-s", "qdisc"] and callable(args.func)


def test_cli_bad_timeout_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(["lab", "--timeout", "0", "--", "true"])
    assert args.func(args) == 2
    assert "timeout" in capsys.readouterr().err


def test_cli_lab_failure_exits_125_with_message(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def boom(*_a: object, **_k: object) -> None:
        raise GuestPanic("guest kernel panicked: Kernel panic - not syncing: x", "rerun", "console tail")

    monkeypatch.setattr(cli, "run_in_lab", boom)
    args = _parse(["lab", "--", "true"])
    assert args.func(args) == 125
    err = capsys.readouterr().err
    assert "panicked" in err and "console tail" in err


def test_cli_timeout_returns_124(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "run_in_lab", lambda *a, **k: vm.LabResult(124, "", 1.0, 2.0, timed_out=True))
    args = _parse(["lab", "--timeout", "3", "--", "sleep", "9"])
    assert args.func(args) == 124
    assert "did not finish within --timeout 3" in capsys.readouterr().err


def _fake_tree(root: Path, kver: str, image: bytes, pvh: bool = True) -> KernelTree:
    (root / "boot").mkdir(parents=True)
    (root / "boot" / f"vmlinuz-{kver}").write_bytes(image)
    (root / "boot" / f"config-{kver}").write_text("CONFIG_PVH=y\n" if pvh else "# CONFIG_PVH is not set\n")
    (root / ".complete").write_text(kver + "\n")
    return KernelTree(f"linux-image-{kver}", kver, root)


@pytest.mark.parametrize("compress", [lzma.compress, gzip.compress])
def test_vmlinux_is_unpacked_from_the_bzimage(tmp_path: Path, compress: Callable[[bytes], bytes]) -> None:
    elf = b"\x7fELF" + bytes(range(256)) * 50
    tree = _fake_tree(tmp_path, "9.9.9-test", b"MZ setup code" + compress(elf) + b"trailer")
    assert ensure_vmlinux(tree) == tree.vmlinux == tree.boot_image
    assert tree.vmlinux.read_bytes() == elf


def test_bzimage_is_kept_without_pvh(tmp_path: Path) -> None:
    tree = _fake_tree(tmp_path, "9.9.9-test", b"MZ" + lzma.compress(b"\x7fELF..."), pvh=False)
    assert ensure_vmlinux(tree) == tree.vmlinuz == tree.boot_image


@pytest.mark.skipif(find_tool("apt-get") is None, reason="needs apt-get")
def test_cached_kernel_is_used_when_the_archive_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _fake_tree(tmp_path / "kernels" / "linux-image-9.9.9-test", "9.9.9-test", b"MZ", pvh=False)
    monkeypatch.setattr(kernel, "resolve_package", lambda: "linux-image-0.0.0-nonexistent-amd64")
    said: list[str] = []
    assert ensure_kernel(tmp_path, log=said.append) == old
    assert any("using cached linux-image-9.9.9-test" in m for m in said)
