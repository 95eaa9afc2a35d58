"""The TCP telemetry sampler's records and their trace tracks (the live sampler: tests/network/test_tcp_telemetry.py)."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.collect.records import read_trial
from testbed.collect.tcp_sampler import connection_row
from testbed.collect.trace import build_trace, merge_trial, validate_trace
from tests.analysis.fakes import write_trial


class FakeMsg(dict):
    """A socket-diag message: header fields by key, ``INET_DIAG_INFO`` by get_attr."""

    def __init__(self, src: str, dst: str, info: dict | None, sport: int = 40000, dport: int = 29500) -> None:
        super().__init__(idiag_src=src, idiag_dst=dst, idiag_sport=sport, idiag_dport=dport)
        self.info = info

    def get_attr(self, name: str):
        return self.info if name == "INET_DIAG_INFO" else None


INFO = {"tcpi_snd_cwnd": 42, "tcpi_snd_ssthresh": 0x7FFFFFFF, "tcpi_rtt": 40321, "tcpi_rttvar": 812,
        "tcpi_min_rtt": 40011, "tcpi_total_retrans": 3, "tcpi_lost": 0, "tcpi_unacked": 17,
        "tcpi_bytes_acked": 123456, "tcpi_bytes_received": 99, "tcpi_delivery_rate": 6_250_000,
        "tcpi_snd_mss": 1448, "tcpi_ca_state": 3}


def test_a_connection_row_carries_tcp_info_in_plain_units():
    row = connection_row(FakeMsg("10.1.0.1", "10.2.0.1", INFO))
    assert row["src"] == "10.1.0.1:40000" and row["dst"] == "10.2.0.1:29500"
    assert row["cwnd"] == 42 and row["rtt_us"] == 40321 and row["min_rtt_us"] == 40011
    assert row["ssthresh"] is None  # "infinite" before the first loss
    assert row["delivery_rate_bps"] == 50_000_000 and row["ca_state"] == "recovery"
    assert row["retrans_total"] == 3 and row["bytes_acked"] == 123456


def test_loopback_and_info_less_sockets_are_left_out():
    assert connection_row(FakeMsg("127.0.0.1", "127.0.0.1", INFO)) is None
    assert connection_row(FakeMsg("10.1.0.1", "10.2.0.1", None)) is None


def _rows() -> list[dict]:
    base = connection_row(FakeMsg("10.1.0.1", "10.2.0.1", INFO))
    return [{"ts": 1_000_000 * k, "node": "h0", **base, "cwnd": 10 + k} for k in range(5)]


def test_trace_has_a_track_per_connection():
    obj = build_trace([], tcp=_rows())
    assert validate_trace(obj) == []
    conn = [e for e in obj["traceEvents"] if e["ph"] == "C" and e["name"] == "tcp 10.1.0.1:40000->10.2.0.1:29500"]
    assert [e["args"]["cwnd"] for e in conn] == [10, 11, 12, 13, 14]
    assert conn[0]["args"]["rtt_ms"] == 40.321
    assert any(e["name"].endswith("retransmits") for e in obj["traceEvents"] if e["ph"] == "C")


def test_a_trial_with_tcp_samples_reads_and_merges(tmp_path: Path):
    d = write_trial(tmp_path / "bsp", "bsp-hier", 0, steps=4)
    (d / "samples" / "tcp.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    tr = read_trial(d)
    assert len(tr.tcp) == 5 and tr.problems == []
    path, problems = merge_trial(d)
    assert problems == []
    names = {e["name"] for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "C"}
    assert "tcp 10.1.0.1:40000->10.2.0.1:29500" in names


def test_a_trial_without_tcp_samples_is_not_damaged(tmp_path: Path):
    d = write_trial(tmp_path / "bsp", "bsp-hier", 0, steps=4)
    tr = read_trial(d)
    assert tr.tcp == [] and not any("tcp" in p for p in tr.problems)
