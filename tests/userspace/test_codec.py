"""Netlink message layout for NFQUEUE, and rule cleanup parsing; no root needed."""

from __future__ import annotations

import socket
import struct
import subprocess
from collections.abc import Sequence

import pytest

from traffic_control.userspace import nfq, rules


def test_verdict_prefix_layout() -> None:
    msg = nfq.verdict_prefix(513, batch=False) + struct.pack(">II", nfq.NF_ACCEPT, 99)
    length, msg_type, flags, _seq, _pid = struct.unpack_from("=IHHII", msg)
    assert length == len(msg) == 32
    assert msg_type == nfq.NFQNL_MSG_VERDICT and flags == nfq.NLM_F_REQUEST
    assert struct.unpack_from(">H", msg, 18)[0] == 513  # res_id = queue, big endian
    alen, atype = struct.unpack_from("=HH", msg, 20)
    assert (alen, atype) == (12, nfq.NFQA_VERDICT_HDR)
    assert struct.unpack_from(">II", msg, 24) == (1, 99)
    batch = nfq.verdict_prefix(513, batch=True)
    assert struct.unpack_from("=H", batch, 4)[0] == nfq.NFQNL_MSG_VERDICT_BATCH


def test_config_message_attributes() -> None:
    msg = nfq.config_message(7, 3, copy_meta=True, maxlen=5000, flags=nfq.NFQA_CFG_F_GSO,
                             flags_mask=nfq.NFQA_CFG_F_GSO)
    length, msg_type, flags, seq, _ = struct.unpack_from("=IHHII", msg)
    assert (length, msg_type, seq) == (len(msg), nfq.NFQNL_MSG_CONFIG, 3)
    assert flags & nfq.NLM_F_ACK
    attrs = {}
    off = 20
    while off < len(msg):
        alen, atype = struct.unpack_from("=HH", msg, off)
        attrs[atype] = msg[off + 4:off + alen]
        off += (alen + 3) & ~3
    assert attrs[nfq.NFQA_CFG_PARAMS] == struct.pack(">IB", 0, nfq.NFQNL_COPY_META)
    assert attrs[nfq.NFQA_CFG_QUEUE_MAXLEN] == struct.pack(">I", 5000)
    assert attrs[nfq.NFQA_CFG_FLAGS] == attrs[nfq.NFQA_CFG_MASK] == struct.pack(">I", 4)


def _packet_msg(pkt_id: int, first_attr_mark: bool = False) -> bytes:
    attrs = b""
    if first_attr_mark:
        attrs += struct.pack("=HH", 8, 3) + struct.pack(">I", 1)
    attrs += struct.pack("=HH", 11, nfq.NFQA_PACKET_HDR) + struct.pack(">IHB", pkt_id, 0x0800, 4) + b"\0"
    body = struct.pack("=BBH", socket.AF_INET, 0, socket.htons(1)) + attrs
    return struct.pack("=IHHII", 16 + len(body), nfq.NFQNL_MSG_PACKET, 0, 0, 0) + body


def test_parse_packets_and_errors() -> None:
    err = struct.pack("=IHHII", 36, nfq.NLMSG_ERROR, 0, 5, 0) + struct.pack("=i", -16) + b"\0" * 16
    data = _packet_msg(41) + _packet_msg(42, first_attr_mark=True) + err
    ids, errors = nfq.parse(data, len(data))
    assert ids == [41, 42]
    assert errors == [(5, 16)]


def test_rule_cleanup_finds_only_marked_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = (
        "*mangle\n:POSTROUTING ACCEPT [0:0]\n"
        "-A POSTROUTING -o eth9 -j MARK --set-xmark 0x1/0xffffffff\n"
        '-A POSTROUTING -o r1-eth1 -m comment --comment "tc-userspace:r1-eth1:q4" -j NFQUEUE --queue-num 4\n'
        '-A POSTROUTING -o r1-eth2 -m comment --comment "tc-userspace:r1-eth2:q5" -j NFQUEUE --queue-num 5\n'
        "COMMIT\n"
    )
    calls: list[list[str]] = []

    def fake_run(argv: Sequence[str], prefix: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append([*prefix, *argv])
        out = saved if argv[0] == "iptables-save" else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(rules, "_run", fake_run)
    monkeypatch.setattr(rules, "_available", lambda tool: tool.startswith("iptables"))
    assert rules.remove(["nsenter", "--net=/x", "--"], ifname="r1-eth1") == 1
    deletes = [c for c in calls if "-D" in c]
    assert deletes == [["nsenter", "--net=/x", "--", "iptables", "-w", "-t", "mangle", "-D", "POSTROUTING",
                        "-o", "r1-eth1", "-m", "comment", "--comment", "tc-userspace:r1-eth1:q4",
                        "-j", "NFQUEUE", "--queue-num", "4"]]
    calls.clear()
    assert rules.remove() == 2
