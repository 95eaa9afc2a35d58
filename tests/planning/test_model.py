"""Plan JSON round trip, validation errors naming the field, and the cost model by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest

from testbed.planning.model import Plan, Tree, evaluate, route_mismatches, validate_plan
from testbed.planning.solver import plan_blp
from traffic_control.errors import ValidationError

from .graphs import GBIT, MBIT, Bps, build, triangle

S = 100_000_000


def _plan() -> Plan:
    return plan_blp(triangle(), S)


def test_json_round_trip_keeps_everything():
    plan = _plan()
    back = Plan.from_json(plan.to_json())
    assert back.trees == plan.trees and back.dcs == plan.dcs and back.size_bytes == S
    assert back.chunks == plan.chunks and back.solver == plan.solver
    assert back.predicted_time_s == pytest.approx(plan.predicted_time_s)
    assert back.link_bytes() == plan.link_bytes()
    validate_plan(back, triangle())
    data = json.loads(plan.to_json())
    assert data["format"] == "blp-plan/1"
    assert {"root", "parents", "share", "chunks", "latency_s"} <= set(data["trees"][0])
    # the CLI's --json output (plan wrapped with baselines) reads back too
    assert Plan.from_json(json.dumps({"plan": data, "baselines": {}})).trees == plan.trees


def _with_tree(plan: Plan, i: int, **changes) -> Plan:
    trees = list(plan.trees)
    trees[i] = dataclasses.replace(trees[i], **changes)
    return dataclasses.replace(plan, trees=tuple(trees))


def test_validation_names_missing_link():
    g = triangle()
    g.remove_edge("a", "c")
    g.remove_edge("c", "a")
    plan = _plan()  # planned on the full triangle: some tree uses a-c
    i = next(k for k, t in enumerate(plan.trees) if ("a", "c") in t.parents.items() or ("c", "a") in t.parents.items())
    with pytest.raises(ValidationError) as e:
        validate_plan(plan, g)
    assert e.value.field.startswith(f"plan.trees[{i}].parents.")
    assert "lacks" in e.value.problem


@pytest.mark.parametrize("change, field, words", [
    ({"root": "z"}, "plan.trees[0].root", "not a DC"),
    ({"root": "a", "parents": {"b": "a"}}, "plan.trees[0].parents", "does not span"),
    ({"root": "a", "parents": {"a": "b", "b": "a", "c": "a"}}, "plan.trees[0].parents.a", "root has a parent"),
    ({"share": -0.1}, "plan.trees[0].share", ">= 0"),
    ({"chunks": 0}, "plan.trees[0].chunks", "chunk"),
])
def test_validation_errors(change, field, words):
    plan = plan_blp(triangle(), S)
    bad = _with_tree(plan, 0, **change)
    with pytest.raises(ValidationError) as e:
        validate_plan(bad, triangle())
    assert e.value.field == field and words in e.value.problem


def test_validation_shares_and_cycles_and_dcs():
    g = triangle()
    plan = _plan()
    bad = _with_tree(plan, 0, share=plan.trees[0].share + 0.1)
    with pytest.raises(ValidationError, match="sum to") as e:
        validate_plan(bad, g)
    assert e.value.field == "plan.trees"
    cyc = dataclasses.replace(plan, trees=(Tree("a", {"b": "c", "c": "b"}, 1.0, 1),))
    with pytest.raises(ValidationError, match="cycle"):
        validate_plan(cyc, g)
    g2 = build([("a", "b", GBIT, 0.0), ("b", "c", GBIT, 0.0), ("c", "x", GBIT, 0.0)])
    with pytest.raises(ValidationError) as e:
        validate_plan(plan, g2)
    assert e.value.field == "plan.dcs"


@pytest.mark.parametrize("text, field", [
    ("not json", "plan"),
    ("[]", "plan"),
    ('{"dcs": ["a"], "size_bytes": 0, "trees": [{"root": "a", "parents": {}, "share": 1}]}', "plan.size_bytes"),
    ('{"dcs": ["a"], "size_bytes": 5, "trees": []}', "plan.trees"),
    ('{"dcs": ["a"], "size_bytes": 5, "trees": [{"root": 3}]}', "plan.trees[0].root"),
    ('{"dcs": ["a"], "size_bytes": 5, "trees": [{"root": "a", "parents": [], "share": 1}]}', "plan.trees[0].parents"),
    ('{"dcs": ["a"], "size_bytes": 5, "trees": [{"root": "a", "share": "x"}]}', "plan.trees[0].share"),
    ('{"format": "other/9", "dcs": ["a"], "size_bytes": 5, "trees": []}', "plan.format"),
])
def test_from_json_errors_name_the_field(text, field):
    with pytest.raises(ValidationError) as e:
        Plan.from_json(text)
    assert e.value.field == field


def test_cost_model_by_hand_two_dcs():
    rate, delay, size, k = 100 * MBIT, 0.02, 8_000_000, 8
    g = build([("x", "y", rate, delay)])
    cost = evaluate(g, [Tree("x", {"y": "x"}, 1.0, k)], size)
    bw = size / Bps(rate)
    chunk_time = size / k / Bps(rate)
    assert cost.bandwidth_time_s == pytest.approx(bw)
    # one chunk up, one down, less the last chunk's send that the bandwidth term already holds
    assert cost.latency_time_s == pytest.approx(2 * (delay + chunk_time) - chunk_time)
    assert cost.time_s == pytest.approx(bw + 2 * delay + chunk_time)
    # rooted at the link: the direct exchange, one crossing
    linked = evaluate(g, [Tree("x", {"y": "x"}, 1.0, k, pair="y")], size)
    assert linked.latency_time_s == pytest.approx(delay)
    assert linked.time_s == pytest.approx(bw + delay)


def test_link_root_latency_by_hand():
    # chain a - b - c, the tree rooted at the link a-b: side A = {a}, side B = {b, c}
    g = build([("a", "b", GBIT, 0.01), ("b", "c", GBIT, 0.03)])
    t = Tree("a", {"b": "a", "c": "b"}, 1.0, 4, pair="b")
    chunk = S / 4 / Bps(GBIT)
    hab, hbc = 0.01 + chunk, 0.03 + chunk
    at_a = hbc + hab                  # c climbs to b, b's side crosses to a
    at_b = max(hbc, hab)              # b has c's sum, and a's arrives over the link
    want = max(at_a, at_b + hbc) - chunk
    assert evaluate(g, [t], S).tree_latency_s[0] == pytest.approx(want)
    # hung from b instead: c and a climb one hop each, then one hop down
    assert evaluate(g, [Tree("b", {"a": "b", "c": "b"}, 1.0, 4)], S).tree_latency_s[0] == pytest.approx(
        hbc + hbc - chunk)
    assert t.side("c") == "b" and t.side("a") == "a" and t.label() == "a<>b"
    assert Plan.from_dict(json.loads(json.dumps(_one_tree_plan(g, t).to_dict()))).trees[0].pair == "b"


def _one_tree_plan(g, t):
    return Plan(tuple(g.nodes), S, (t,), t.chunks, "hand", evaluate(g, [t], S))


def test_link_root_pair_must_be_a_child_of_the_root():
    g = build([("a", "b", GBIT, 0.01), ("b", "c", GBIT, 0.03)])
    good = _one_tree_plan(g, Tree("a", {"b": "a", "c": "b"}, 1.0, 1))
    bad = dataclasses.replace(good, trees=(dataclasses.replace(good.trees[0], pair="c"),))
    with pytest.raises(ValidationError) as e:
        validate_plan(bad, g)
    assert e.value.field == "plan.trees[0].pair"
    validate_plan(_one_tree_plan(g, Tree("a", {"b": "a", "c": "b"}, 1.0, 1, pair="b")), g)


def test_cost_model_sums_shared_links_and_takes_deepest_branch():
    g = build([("a", "b", GBIT, 0.01), ("b", "c", GBIT, 0.03), ("a", "c", GBIT, 0.0)])
    t1 = Tree("a", {"b": "a", "c": "b"}, 0.5, 1)   # chain c-b-a
    t2 = Tree("c", {"a": "c", "b": "a"}, 0.5, 1)   # chain b-a-c
    cost = evaluate(g, [t1, t2], S)
    loads = {(ll.src, ll.dst): ll.bytes for ll in cost.links}
    assert loads[("a", "b")] == loads[("b", "a")] == S  # both trees use a-b
    assert loads[("b", "c")] == S / 2 and loads[("a", "c")] == S / 2
    chunk = S / 2 / Bps(GBIT)
    assert cost.tree_latency_s[0] == pytest.approx(2 * (0.04 + 2 * chunk) - chunk)
    assert cost.latency_time_s == max(cost.tree_latency_s)


def test_route_mismatches_reports_relayed_tree_edges():
    plan = _plan()
    assert route_mismatches(plan, lambda s, d: [s, d]) == []
    notes = route_mismatches(plan, lambda s, d: [s, "b", d] if {s, d} == {"a", "c"} else [s, d])
    assert notes and all("routed via" in n for n in notes)
