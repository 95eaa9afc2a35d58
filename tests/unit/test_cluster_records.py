"""Records fetched from another server (testbed.cluster.trialnet.extract) and the parts' impairments as one."""

from __future__ import annotations

import io
import tarfile

import pytest

from testbed.cluster.trialnet import extract
from testbed.cluster.view import Impairments


def archive(*members: tuple[str, bytes | None, bytes]) -> bytes:
    """(name, data or None for a directory, type) -> a tar archive."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def test_files_and_directories_land_under_the_trial(tmp_path):
    names = extract(archive(("./events", None, tarfile.DIRTYPE), ("./events/b-h1.worker.1.jsonl", b'{"ts": 1}\n',
                                                                   tarfile.REGTYPE),
                            ("./procs/b-h1.worker.1.json", b"{}", tarfile.REGTYPE)), tmp_path)
    assert (tmp_path / "events" / "b-h1.worker.1.jsonl").read_bytes() == b'{"ts": 1}\n'
    assert (tmp_path / "procs" / "b-h1.worker.1.json").exists() and len(names) == 2


@pytest.mark.parametrize("member", [("../escape", b"x", tarfile.REGTYPE), ("/abs/x", b"x", tarfile.REGTYPE),
                                    ("./events/link", None, tarfile.SYMTYPE)])
def test_a_member_outside_the_trial_or_not_a_plain_file_is_refused(tmp_path, member):
    trial = tmp_path / "trial"
    trial.mkdir()
    with pytest.raises(ValueError):
        extract(archive(member), trial)
    assert not (tmp_path / "escape").exists() and not (trial / "events" / "link").exists()


def test_the_parts_impairment_is_one_backend_or_says_each():
    assert Impairments({"s1": "userspace", "s2": "userspace"}).backend == "userspace"
    mixed = Impairments({"s1": "netem", "s2": "userspace"}, ("delay a->b",))
    assert mixed.backend == "mixed(s1: netem, s2: userspace)"
    assert mixed.to_dict()["skipped"] == ["delay a->b"]
