"""The shape of one direction of a link, validated, with the values tc needs derived.

A :class:`LinkShape` is what a spec says about one direction of a link: rate,
one-way delay, jitter, loss, reordering, queue limit.  Everything a kernel
qdisc needs beyond that is *derived* here, in one place, so that the netlink
backend, the dry run and the userspace backend agree:

* HTB burst is sized from the rate (``rate x burst_time``, at least one GSO
  super-packet), never a fixed 15 KB: a burst smaller than what the rate moves
  in one timer tick starves the class at Gbit/s rates.
* The netem queue limit is sized from the bandwidth-delay product with
  headroom: packets held for the delay plus one round trip of standing queue,
  times ``headroom``.  netem's default of 1000 packets drops at
  Gbit/s x tens of ms.
* Loss is Bernoulli (``loss``) or Gilbert-Elliott (``gilbert_elliott``: a
  good and a bad state, bursts of loss); ``duplicate`` and ``corrupt`` are
  netem's (the userspace backend holds packet ids, not payloads, and refuses
  them).
* Jitter reorders packets in netem (each packet gets its own release time)
  unless netem is also given a ``rate``, in which case release times are kept
  monotonic.  ``reorder=False`` (the default) therefore sets a netem rate far
  above the link rate: order is kept and the rate is still HTB's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, model_validator

from .delay_dist import DISTRIBUTIONS
from .errors import ValidationError
from .fields import Duration, Packets, Percent, Rate, SpecModel, unit_field, validate
from .units import format_rate, format_time

#: An interface's MTU unless the spec says otherwise (a veth's own default).
DEFAULT_MTU = 1500
#: IP + TCP headers of a data segment with the timestamp option (Linux's default), and the Ethernet header.
TCP_IP_HEADER_BYTES, ETHERNET_HEADER_BYTES = 52, 14


def tcp_payload_fraction(mtu: int = DEFAULT_MTU) -> float:
    """Tensor bytes per wire byte a bulk TCP flow gets at ``mtu``: 1448 / 1514 at 1500, 8948 / 9014 at 9000."""
    return (mtu - TCP_IP_HEADER_BYTES) / (mtu + ETHERNET_HEADER_BYTES)


#: The largest skb a GSO/TSO path hands a qdisc.
GSO_MAX_BYTES = 65536
#: Segments per skb on an interface of a network built without GSO (`gso: false`): wire-sized packets.
WIRE_GSO_SEGS = 1
#: netem's own default queue limit (packets); the derived limit does not use it as a floor.
NETEM_DEFAULT_LIMIT = 1000
#: Smallest derived queue limit (packets).
MIN_LIMIT_PKTS = 64
#: Rate given to netem only to keep jittered packets in order (bit/s; u32 max in bytes/s, ~34.4 Gbit/s),
#: or 4 x the link's rate where that is higher (then through netem's 64-bit rate attribute).
NO_REORDER_NETEM_RATE_BPS = (2**32 - 1) * 8


def order_keeping_rate_bps(link_rate_bps: float | None) -> float:
    """netem's rate on an order-keeping leaf: never the bottleneck (at least 4 x the HTB rate)."""
    return max(NO_REORDER_NETEM_RATE_BPS, 4 * (link_rate_bps or 0))
#: Longest delay + jitter a packet may be held (s).  netem's delay travels in 32-bit scheduler
#: ticks (15.625 ticks per microsecond: at most about 274 s); the userspace backend holds at most 60 s.
MAX_DELAY_S = 60.0
#: Jitter distributions (traffic_control.delay_dist): uniform, or a table both backends draw from.
JITTER_DISTRIBUTIONS = DISTRIBUTIONS


@dataclass(frozen=True)
class LinkShape:
    """One direction of a link.  Units: bit/s, seconds, percent, packets, bytes."""

    rate_bps: float | None = None
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss_pct: float = 0.0
    reorder: bool = False
    limit: int | None = None
    mtu: int = DEFAULT_MTU
    burst_time_s: float = 0.001
    headroom: float = 2.0
    jitter_interval_s: float | None = None
    #: how the jittered delay is distributed: uniform within delay +- jitter, or a table (jitter = its sd)
    jitter_distribution: str = "uniform"
    #: share of candidate packets sent at once, without the delay, overtaking the held ones (netem's reorder P)
    reorder_pct: float = 0.0
    #: every gap-th packet is a candidate (netem's gap; 1: every packet)
    reorder_gap: int = 1
    duplicate_pct: float = 0.0
    corrupt_pct: float = 0.0
    #: Gilbert-Elliott loss: P(good -> bad) per packet; 0 = no Gilbert-Elliott model (``loss_pct`` applies)
    ge_p_pct: float = 0.0
    #: P(bad -> good) per packet (the mean bad run is 1 / r packets)
    ge_r_pct: float = 0.0
    #: loss probability in the bad state (netem's 1 - h)
    ge_loss_bad_pct: float = 100.0
    #: loss probability in the good state (netem's 1 - k)
    ge_loss_good_pct: float = 0.0
    #: Derived, never written in a spec: the longest round trip of the flows crossing this direction
    #: (``Topology.queue_rtts``), set by the network plan; the derived queue limit holds one of it.
    queue_rtt_s: float | None = None

    # ----------------------------------------------------------------- checks
    def __post_init__(self) -> None:
        self.validate()

    def validate(self, field: str = "") -> None:
        """Raise :class:`ValidationError` naming ``field.<attr>`` for any impossible value."""

        def at(name: str) -> str:
            return f"{field}.{name}" if field else name

        for name, key, example in (("delay_s", "delay", "'10ms'"), ("jitter_s", "jitter", "'1ms'"),
                                   ("loss_pct", "loss", "'0.5%'"), ("burst_time_s", "burst_time", "'1ms'"),
                                   ("headroom", "headroom", "2"), ("duplicate_pct", "duplicate", "'1%'"),
                                   ("corrupt_pct", "corrupt", "'0.1%'"), ("ge_p_pct", "gilbert_elliott.p", "'1%'"),
                                   ("ge_r_pct", "gilbert_elliott.r", "'25%'"),
                                   ("ge_loss_bad_pct", "gilbert_elliott.loss_bad", "'100%'"),
                                   ("ge_loss_good_pct", "gilbert_elliott.loss_good", "'0%'"),
                                   ("reorder_pct", "reorder_probability", "'25%'")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValidationError(at(key), f"must be a finite number, got {value!r}", f"write e.g. {key}: {example}")
        if self.rate_bps is not None and not self.rate_bps > 0:
            raise ValidationError(at("rate"), f"rate must be positive, got {self.rate_bps}",
                                  "give e.g. '100Mbit', or omit rate for an unshaped link")
        if self.rate_bps is not None and self.rate_bps < 8000:
            raise ValidationError(at("rate"), f"rate {self.rate_bps} bit/s is below 8 kbit/s",
                                  "rates are in bit/s: write e.g. '100Mbit'")
        if self.delay_s < 0:
            raise ValidationError(at("delay"), f"delay must be >= 0, got {self.delay_s}", "write e.g. '10ms'")
        if self.jitter_s < 0:
            raise ValidationError(at("jitter"), f"jitter must be >= 0, got {self.jitter_s}", "write e.g. '1ms'")
        if self.jitter_s > 0 and self.delay_s == 0:
            raise ValidationError(at("jitter"), "jitter without delay",
                                  "give a delay too (jitter varies the delay around its mean)")
        if self.delay_s + self.jitter_s > MAX_DELAY_S:
            raise ValidationError(at("delay"), f"delay + jitter {format_time(self.delay_s + self.jitter_s)} is more "
                                  f"than {format_time(MAX_DELAY_S)}", "delays are one way, e.g. '20ms'; "
                                  f"both backends hold a packet at most {format_time(MAX_DELAY_S)}")
        if self.jitter_distribution not in DISTRIBUTIONS:
            raise ValidationError(at("distribution"), f"unknown distribution {self.jitter_distribution!r}",
                                  f"use one of: {', '.join(DISTRIBUTIONS)}")
        if self.jitter_distribution != "uniform" and not self.jitter_s:
            raise ValidationError(at("distribution"), f"distribution {self.jitter_distribution} without jitter",
                                  "give a jitter too (for this distribution it is the standard deviation)")
        if not 0 <= self.reorder_pct <= 100:
            raise ValidationError(at("reorder_probability"), f"must be within [0, 100] %, got {self.reorder_pct}",
                                  "write e.g. reorder_probability: 25%")
        if self.reorder_pct > 0 and not self.delay_s > 0:
            raise ValidationError(at("reorder_probability"), "reordering without delay",
                                  "give a delay too: a packet sent at once overtakes the ones the delay holds")
        if isinstance(self.reorder_gap, bool) or not isinstance(self.reorder_gap, int) or self.reorder_gap < 1:
            raise ValidationError(at("reorder_gap"), f"must be an integer >= 1, got {self.reorder_gap!r}",
                                  "write e.g. reorder_gap: 5 (every 5th packet is a candidate)")
        if self.reorder_gap != 1 and not self.reorder_pct:
            raise ValidationError(at("reorder_gap"), "reorder_gap without reorder_probability",
                                  "give reorder_probability too, e.g. 25%")
        if self.jitter_s > self.delay_s:
            raise ValidationError(at("jitter"), f"jitter {format_time(self.jitter_s)} exceeds delay "
                                  f"{format_time(self.delay_s)}", "keep jitter <= delay")
        if not 0 <= self.loss_pct <= 100:
            raise ValidationError(at("loss"), f"loss must be within [0, 100] %, got {self.loss_pct}",
                                  "write e.g. '0.5%'")
        for name, key in (("duplicate_pct", "duplicate"), ("corrupt_pct", "corrupt"), ("ge_p_pct", "gilbert_elliott.p"),
                          ("ge_r_pct", "gilbert_elliott.r"), ("ge_loss_bad_pct", "gilbert_elliott.loss_bad"),
                          ("ge_loss_good_pct", "gilbert_elliott.loss_good")):
            if not 0 <= getattr(self, name) <= 100:
                raise ValidationError(at(key), f"must be within [0, 100] %, got {getattr(self, name)}",
                                      "write e.g. '1%'")
        if self.ge_p_pct > 0 and self.loss_pct > 0:
            raise ValidationError(at("gilbert_elliott"), "both loss and gilbert_elliott given",
                                  "give one loss model: loss (independent) or gilbert_elliott (bursts)")
        if self.ge_p_pct > 0 and not self.ge_r_pct > 0:
            raise ValidationError(at("gilbert_elliott.r"), "r must be > 0 (else the bad state never ends)",
                                  "give e.g. r: 25% (mean bad run 1 / r = 4 packets)")
        if self.queue_rtt_s is not None and not (isinstance(self.queue_rtt_s, (int, float))
                                                 and 0 <= self.queue_rtt_s <= 4 * MAX_DELAY_S):
            raise ValidationError(at("queue_rtt"), f"must be 0 .. {4 * MAX_DELAY_S:g} s, got {self.queue_rtt_s!r}",
                                  "it is derived from the routes; leave it unset")
        if self.limit is not None and self.limit < 1:
            raise ValidationError(at("limit"), f"queue limit must be >= 1 packet, got {self.limit}",
                                  "omit it to size the queue from the bandwidth-delay product")
        if not 576 <= self.mtu <= 65535:
            raise ValidationError(at("mtu"), f"mtu {self.mtu} out of range", "use 576..65535 (1500 is usual)")
        if not 0 < self.burst_time_s <= 1:
            raise ValidationError(at("burst_time"), f"burst_time {self.burst_time_s} out of range",
                                  "use a few ms, e.g. '1ms'")
        if not self.headroom >= 1:
            raise ValidationError(at("headroom"), f"headroom must be >= 1, got {self.headroom}", "use e.g. 2")
        if self.jitter_interval_s is not None and not (isinstance(self.jitter_interval_s, (int, float))
                                                       and not isinstance(self.jitter_interval_s, bool)
                                                       and 0.001 <= self.jitter_interval_s <= MAX_DELAY_S):
            raise ValidationError(at("jitter_interval"), f"jitter_interval must be 1 ms .. 60 s, got "
                                  f"{self.jitter_interval_s!r}", "write e.g. jitter_interval: 40ms, or omit it "
                                  "(default 10 x jitter)")

    # ------------------------------------------------------------- derived
    @property
    def needs_netem(self) -> bool:
        """True when delay, jitter or loss are asked for (things HTB cannot do)."""
        return (self.delay_s > 0 or self.jitter_s > 0 or self.loss_pct > 0 or self.ge_p_pct > 0
                or self.duplicate_pct > 0 or self.corrupt_pct > 0 or self.reorder_pct > 0)

    @property
    def immediate_share(self) -> float:
        """The long-run share of packets sent at once by ``reorder_probability``: ``gap - 1`` delayed
        packets, then candidates each sent at once with probability p: ``1 / (gap - 1 + 1/p)``."""
        if not self.reorder_pct:
            return 0.0
        return 1.0 / (self.reorder_gap - 1 + 100.0 / self.reorder_pct)

    @property
    def gilbert_elliott(self) -> bool:
        return self.ge_p_pct > 0

    @property
    def expected_loss_pct(self) -> float:
        """The long-run loss rate the spec implies: ``loss``, or Gilbert-Elliott's stationary one
        (``pi_bad = p / (p + r)``; ``pi_bad x loss_bad + (1 - pi_bad) x loss_good``)."""
        if not self.gilbert_elliott:
            return self.loss_pct
        pi_bad = self.ge_p_pct / (self.ge_p_pct + self.ge_r_pct)
        return pi_bad * self.ge_loss_bad_pct + (1 - pi_bad) * self.ge_loss_good_pct

    @property
    def burst_bytes(self) -> int:
        """HTB burst: what the rate moves in ``burst_time``, at least one GSO packet + MTU."""
        if self.rate_bps is None:
            return 0
        return max(int(math.ceil(self.rate_bps / 8 * self.burst_time_s)), GSO_MAX_BYTES + self.mtu)

    @property
    def netem_limit(self) -> int:
        """Packets netem may hold: explicit ``limit``, or derived from the BDP.

        In flight inside netem: ``rate x (delay + jitter)``.  Standing queue:
        one round trip of the rate, the round trip being the longest of the
        flows that cross this direction (``queue_rtt_s``, from the routes) or
        this link's own (``2 x (delay + jitter)``) where that is longer or the
        shape stands alone.  Their sum in MTU-sized packets times
        ``headroom``, and never below ``MIN_LIMIT_PKTS`` or 2 ms of the rate.
        Packets are wire packets: the network sends without GSO unless its
        spec says ``gso: true`` (then each of these may be a 64 KiB skb).
        """
        if self.limit is not None:
            return self.limit
        if self.rate_bps is None:
            rate = 10e9  # unshaped: size for what a veth carries (~10 Gbit/s)
        else:
            rate = self.rate_bps
        hold = self.delay_s + self.jitter_s
        rtt = max(2 * hold, self.queue_rtt_s or 0.0)
        pkts = rate / 8 * (hold + rtt) / self.mtu
        # Floors: MIN_LIMIT_PKTS, and 2 ms of the rate (delay-free Gbit/s links).  Not netem's
        # 1000 packets: that is ~480 ms of standing queue at 25 Mbit/s (bufferbloat).
        floor = max(MIN_LIMIT_PKTS, int(math.ceil(rate / 8 * 0.002 / self.mtu)))
        return max(floor, int(math.ceil(pkts * self.headroom)))

    @property
    def bdp_bytes(self) -> float:
        """Bandwidth x round trip over this direction (both ways assumed equal)."""
        if self.rate_bps is None:
            return 0.0
        return self.rate_bps / 8 * 2 * self.delay_s

    # ------------------------------------------------------------ editing
    def with_changes(self, **changes: Any) -> LinkShape:
        return replace(self, **changes)

    def without_netem(self) -> LinkShape:
        """The same shape with delay, jitter and loss removed (rate only)."""
        return replace(self, delay_s=0.0, jitter_s=0.0, jitter_distribution="uniform", reorder_pct=0.0, reorder_gap=1,
                       loss_pct=0.0, duplicate_pct=0.0, corrupt_pct=0.0,
                       ge_p_pct=0.0, ge_r_pct=0.0, ge_loss_bad_pct=100.0, ge_loss_good_pct=0.0)

    # -------------------------------------------------------------- (de)ser
    def to_dict(self, human: bool = True) -> dict[str, Any]:
        """Spec form.  ``human`` writes units (``100Mbit``); else base units as numbers."""
        d: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default or f.name == "queue_rtt_s":  # derived from the routes, not a spec key
                continue
            d[f.name] = value
        if not human:
            return d
        out: dict[str, Any] = {}
        for k, v in d.items():
            if k.startswith("ge_"):
                out.setdefault("gilbert_elliott", {})[k[3:-4]] = f"{v:g}%"
            elif k in ("duplicate_pct", "corrupt_pct"):
                out[k[:-4]] = f"{v:g}%"
            elif k == "rate_bps":
                out["rate"] = format_rate(v)
            elif k == "jitter_distribution":
                out["distribution"] = v
            elif k == "reorder_pct":
                out["reorder_probability"] = f"{v:g}%"
            elif k in ("delay_s", "jitter_s", "burst_time_s", "jitter_interval_s"):
                out[k[:-2]] = format_time(v)
            elif k == "loss_pct":
                out["loss"] = f"{v:g}%"
            else:
                out[k] = v
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, field: str = "") -> LinkShape:
        """Parse a spec mapping (``rate: 100Mbit, delay: 10ms`` or ``rtt: 20ms``...)."""
        return cls(**parse_shape_fields(data or {}, field))

    def describe(self) -> str:
        parts = [format_rate(self.rate_bps) if self.rate_bps else "unshaped"]
        if self.delay_s:
            parts.append(f"delay {format_time(self.delay_s)}")
        if self.jitter_s:
            dist = "" if self.jitter_distribution == "uniform" else f" {self.jitter_distribution}"
            parts.append(f"jitter {format_time(self.jitter_s)}{dist}{'' if self.reorder else ' (in order)'}")
        if self.loss_pct:
            parts.append(f"loss {self.loss_pct:g}%")
        if self.gilbert_elliott:
            parts.append(f"Gilbert-Elliott loss p {self.ge_p_pct:g}% r {self.ge_r_pct:g}% bad {self.ge_loss_bad_pct:g}% "
                         f"good {self.ge_loss_good_pct:g}% (mean {self.expected_loss_pct:.3g}%)")
        if self.reorder_pct:
            gap = f" gap {self.reorder_gap}" if self.reorder_gap > 1 else ""
            parts.append(f"reorder {self.reorder_pct:g}%{gap} ({self.immediate_share:.1%} sent at once)")
        if self.duplicate_pct:
            parts.append(f"duplicate {self.duplicate_pct:g}%")
        if self.corrupt_pct:
            parts.append(f"corrupt {self.corrupt_pct:g}%")
        return ", ".join(parts)


def _bare_number(value: Any) -> float:
    """The number a unit-less value (``20`` or ``"20"``) holds, else NaN (compares false)."""
    if isinstance(value, bool):
        return math.nan
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return math.nan
    return math.nan


def _wan_time(value: Any, info: Any) -> Any:
    """A delay, RTT or jitter; a unit-less number above 1 (``20`` or ``"20"``) is refused:
    it would mean 20 s, almost surely meant as 20 ms."""
    if _bare_number(value) > 1:
        raise ValidationError(info.field_name, f"bare number {value} means {value} seconds",
                              f"write the unit, e.g. '{value}ms' (or '{value}s' if you mean seconds)")
    return value


WanTime = Annotated[Duration, BeforeValidator(_wan_time)]


class GilbertElliottSpec(SpecModel):
    """Bursty loss: a two-state Markov chain per packet (netem's ``loss gemodel``)."""

    p: Percent = unit_field(fix="e.g. p: 1%")
    """probability per packet of moving from the good to the bad state"""
    r: Percent = unit_field(fix="e.g. r: 25%")
    """probability per packet of moving from the bad to the good state (mean bad run 1 / r packets)"""
    loss_bad: Percent | None = unit_field(None, fix="e.g. loss_bad: 100%")
    """loss probability in the bad state (default 100 %)"""
    loss_good: Percent | None = unit_field(None, fix="e.g. loss_good: 0%")
    """loss probability in the good state (default 0 %)"""


#: Keys of netem's correlation model, refused with a reason (ShapeSpec._no_correlation).
CORRELATION_KEYS = ("correlation", "delay_correlation", "jitter_correlation", "loss_correlation")


class ShapeSpec(SpecModel):
    """One direction of a link as a spec writes it (every key optional: unset keys inherit)."""

    rate: Rate | None = unit_field(fix="e.g. rate: 100Mbit (null: unshaped)")
    """bottleneck rate (HTB); null or absent: unshaped"""
    delay: WanTime | None = unit_field(fix="e.g. delay: 20ms")
    """one-way delay"""
    rtt: WanTime | None = unit_field(fix="e.g. rtt: 40ms (one-way = rtt / 2); give delay or rtt, not both")
    """round-trip time; the one-way delay is half of it"""
    jitter: WanTime | None = unit_field(fix="e.g. jitter: 2ms")
    """delay variation: uniform within delay +- jitter, or the distribution's sd (README "Jitter, defined")"""
    distribution: Literal["uniform", "normal", "pareto", "paretonormal"] | None = unit_field(
        fix="one of: uniform, normal, pareto, paretonormal")
    """how the jittered delay is distributed (default uniform within delay +- jitter); normal, pareto,
    paretonormal: jitter is the standard deviation (traffic_control/delay_dist.py, both backends)"""
    jitter_interval: Duration | None = unit_field(fix="e.g. jitter_interval: 40ms")
    """with order kept, how long one jitter draw holds (default 10 x jitter, at least 1 ms)"""
    loss: Percent | None = unit_field(fix="e.g. loss: 0.1%")
    """random packet loss, independent per packet"""
    gilbert_elliott: GilbertElliottSpec | None = unit_field(fix="e.g. gilbert_elliott: {p: 1%, r: 25%}")
    """bursty loss instead of ``loss`` (both backends)"""
    duplicate: Percent | None = unit_field(fix="e.g. duplicate: 1%")
    """packets sent twice (netem backend only)"""
    corrupt: Percent | None = unit_field(fix="e.g. corrupt: 0.1%")
    """packets with one bit flipped (netem backend only; the receiver's checksum drops them)"""
    reorder_probability: Percent | None = unit_field(fix="e.g. reorder_probability: 25%")
    """share of packets sent at once, without the delay, overtaking those held (netem's reorder; both backends)"""
    reorder_gap: int | None = unit_field(ge=1, fix="e.g. reorder_gap: 5")
    """with reorder_probability: every gap-th packet is a candidate, the others are delayed (default 1)"""
    reorder: bool | None = unit_field(fix="write reorder: true")
    """a jitter draw per packet, packets overtake (netem's default); false: order kept, a draw per interval"""
    limit: Packets | None = unit_field(fix="e.g. limit: 1000")
    """queue limit in packets"""
    mtu: Packets | None = unit_field(fix="e.g. mtu: 1500")
    """the interfaces' MTU (both ends of a link; a LAN's hosts, router port and switch ports), also HTB's burst sizing"""
    burst_time: Duration | None = unit_field(fix="e.g. burst_time: 1ms")
    """HTB burst as time at the rate"""
    headroom: float | None = unit_field(fix="write e.g. 2")
    """HTB ceil / rate headroom factor"""

    @model_validator(mode="before")
    @classmethod
    def _no_correlation(cls, data: Any) -> Any:
        """netem's ``correlation`` (delay, loss) is refused with the reason and what to use instead."""
        if isinstance(data, dict):
            for key in CORRELATION_KEYS:
                if key in data:
                    raise ValidationError(key, "netem-style correlation is not offered: netem mixes each random draw "
                                          "with the previous one (u = rho x last + (1 - rho) x new), which shrinks "
                                          "the spread of what it correlates by sqrt((1 - rho) / (1 + rho)) (0.77 at "
                                          "25 %), so the link would no longer have the spec's distribution",
                                          "for a delay that moves together use jitter_interval (one draw holds that "
                                          "long, order kept); for bursty loss use gilbert_elliott: {p, r}")
        return data

    @model_validator(mode="after")
    def _one_of_delay_rtt(self) -> ShapeSpec:
        if self.delay is not None and self.rtt is not None:
            raise ValidationError("rtt", "both delay and rtt given", "give one of them")
        return self

    def given(self) -> dict[str, Any]:
        """The keys the spec wrote (explicit nulls included), for merging defaults."""
        return {k: getattr(self, k) for k in self.model_fields_set}


SHAPE_KEYS = tuple(ShapeSpec.model_fields)


def shape_kwargs(given: dict[str, Any]) -> dict[str, Any]:
    """Merged spec keys (already parsed) -> LinkShape keyword arguments."""
    kw: dict[str, Any] = {}
    for key, value in given.items():
        if key == "rate":
            kw["rate_bps"] = value
        elif key == "delay":
            kw["delay_s"] = value
        elif key == "rtt":
            kw["delay_s"] = value / 2
        elif key in ("jitter", "burst_time", "jitter_interval"):
            kw[f"{key}_s"] = value
        elif key == "distribution":
            if value is not None:
                kw["jitter_distribution"] = value
        elif key == "reorder_probability":
            if value is not None:
                kw["reorder_pct"] = value
        elif key == "loss":
            kw["loss_pct"] = value
        elif key in ("duplicate", "corrupt"):
            kw[f"{key}_pct"] = value
        elif key == "gilbert_elliott":
            if value is not None:
                ge = value if isinstance(value, GilbertElliottSpec) else GilbertElliottSpec(**value)
                kw.update(ge_p_pct=ge.p, ge_r_pct=ge.r,
                          ge_loss_bad_pct=100.0 if ge.loss_bad is None else ge.loss_bad,
                          ge_loss_good_pct=0.0 if ge.loss_good is None else ge.loss_good)
        elif value is not None or key == "limit":
            kw[key] = value
    return kw


def parse_shape_fields(data: Any, field: str = "") -> dict[str, Any]:
    """Spec keys -> LinkShape keyword arguments, with units parsed and unknown keys rejected
    (``rtt`` may stand in for ``delay``: the one-way delay is half of it)."""
    spec = validate(ShapeSpec, data, field)
    kw = shape_kwargs(spec.given())
    try:  # value constraints of the shape itself, under the spec's path
        LinkShape(**kw)
    except ValidationError as e:
        raise e.under(field) if field else e from None
    return kw


def shape_dict(shape: LinkShape) -> dict[str, Any]:
    """Base-unit dict for manifests and JSON output."""
    return asdict(shape)
