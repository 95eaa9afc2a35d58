"""A topology from a published latency/bandwidth matrix (CSV of region pairs), sources recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli
from topologies import load
from topologies.matrix import dc_name, from_matrix_csv, load_matrix
from traffic_control.errors import ValidationError

REPO = Path(__file__).resolve().parents[2]
AWS = REPO / "topologies" / "matrices" / "aws_seven_regions.csv"


def test_dc_names_are_short_unique_and_keep_the_digits():
    taken: set[str] = set()
    names = []
    for region in ("us-east-1", "ap-northeast-1", "ap-northeast-2", "eu-central-1", "1st-dc", "ap-northeast-1x"):
        names.append(dc_name(region, taken))
        taken.add(names[-1])
    assert names[:4] == ["useast1", "apnorth1", "apnorth2", "eucentr1"]
    assert names[4] == "stdc" and len(set(names)) == len(names) and all(len(n) <= 8 for n in names)


def test_the_shipped_matrix_is_geo_wan():
    topo, spec = load_matrix(str(AWS), name="aws", scale=0.1)
    geo = load("geo_wan")
    region = {dc.label.split()[0]: dc.name for dc in geo.dcs}  # "us-east-1 (N. Virginia)" -> virginia
    mine = {dc.name: region[dc.label] for dc in topo.dcs}
    assert len(topo.links) == len(geo.links) == 7
    for lk in topo.links:
        theirs = geo.link(mine[lk.a], mine[lk.b])
        assert lk.forward.rate_bps == pytest.approx(theirs.forward.rate_bps)
        assert lk.forward.delay_s == pytest.approx(theirs.forward.delay_s)
    assert topo.scale == pytest.approx(0.1)
    assert "aws_seven_regions.csv" in topo.description and "published AWS inter-region" in topo.description
    assert "approximate: public inter-region latency tables" in topo.description


HEADER = "a,b,rtt,rate,source\n"


@pytest.mark.parametrize("text, field", [
    ("a,b,rtt\nx,y,1ms\n", "m.csv.header"),
    (HEADER.replace("source", "source,extra") + "x,y,1ms,1Gbit,s,1\n", "m.csv.header"),
    (HEADER + "x,y,1ms,1Gbit,\n", "m.csv[line 2].source"),
    (HEADER + "x,y,1ms,1Gbit,s\ny,x,2ms,1Gbit,s\n", "m.csv[line 3]"),
    (HEADER + "x,x,1ms,1Gbit,s\n", "m.csv[line 2].b"),
    (HEADER, "m.csv"),
])
def test_bad_matrices_name_file_row_and_column(text, field):
    with pytest.raises(ValidationError) as e:
        from_matrix_csv(text, name="m", source_file="m.csv")
    assert e.value.field == field, e.value


def test_a_bad_value_names_its_row(tmp_path):
    f = tmp_path / "m.csv"
    f.write_text(HEADER + "# a comment\nx,y,10ms,1Gbit,s\ny,z,20,1Gbit,s\n")
    with pytest.raises(ValidationError) as e:
        load_matrix(str(f))
    assert e.value.field == "m.csv[line 4].rtt" and "20ms" in e.value.fix  # the file's line, comments counted
    f.write_text(HEADER + "x,y,10ms,1Gbit,s\nz,w,20ms,1Gbit,s\n")
    with pytest.raises(ValidationError) as e:
        load_matrix(str(f))
    assert e.value.field == "links" and "disconnected" in e.value.problem


def test_the_cli_writes_a_topology_the_testbed_loads(tmp_path):
    out = tmp_path / "aws.yaml"
    r = run_cli("import-matrix", str(AWS), "--name", "aws", "--hosts", "2", "-o", str(out))
    assert r.returncode == 0, r.stderr
    spec = yaml.safe_load(out.read_text())
    assert spec["name"] == "aws" and all(d["hosts"] == 2 for d in spec["dcs"])
    assert {d["label"] for d in spec["dcs"]} >= {"us-east-1", "ap-southeast-1"}
    assert run_cli("topo", str(out)).returncode == 0
    bad = run_cli("import-matrix", str(tmp_path / "missing.csv"))
    assert bad.returncode == 2 and "missing.csv" in bad.stderr
