"""Placement quality: kubegpu never places fewer pods than naive first-fit in arrival order, and places more where
greedy node choice strands ring capacity (the workloads of `benchmarks/placement_bench.py`, seeded)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "placement_bench.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("placement_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("placement_bench", module)
    spec.loader.exec_module(module)
    return module


bench = _bench()
WORKLOADS = bench.workloads(10)


@pytest.mark.parametrize(("name", "nodes", "sizes"), WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_kubegpu_places_at_least_as_many_pods_as_first_fit(
    name: str, nodes: list[tuple[str, str]], sizes: list[int]
) -> None:
    assert bench.kubegpu(nodes, sizes).placed >= bench.first_fit(nodes, sizes).placed


def test_the_issue_example_places_all_six_pods() -> None:
    _, nodes, sizes = WORKLOADS[0]
    assert bench.kubegpu(nodes, sizes).placed == 6


def test_fragmentation_prone_mixes_place_more_than_first_fit() -> None:
    fragmenting = [w for w in WORKLOADS if w[0].startswith("fragmenting")]
    kubegpu = sum(bench.kubegpu(nodes, sizes).placed for _, nodes, sizes in fragmenting)
    first_fit = sum(bench.first_fit(nodes, sizes).placed for _, nodes, sizes in fragmenting)
    assert kubegpu > first_fit
    wins = sum(bench.kubegpu(n, s).placed > bench.first_fit(n, s).placed for _, n, s in fragmenting)
    assert wins >= len(fragmenting) // 2


DEPARTURES = bench.departure_mixes(6)


def test_with_departures_kubegpu_places_more_pods_than_first_fit_and_strands_no_more() -> None:
    # Pods that come and go (each with its own lifetime), far more than the cluster holds: what counts is how many get
    # in. Binpack alone kept empty inf2.48xlarge and trn1.32xlarge nodes for the 12- and 16-device pods and placed
    # fewer pods than first-fit (551 against 565). The fragmentation measure learns that small pods are what gets
    # placed, breaks big nodes when that turns away least, and keeps room where the next pod is likely to fit.
    ff = [bench.first_fit_replay(nodes, events) for _, nodes, events in DEPARTURES]
    kg = [bench.kubegpu_replay(nodes, events) for _, nodes, events in DEPARTURES]
    assert sum(r.placed for r in kg) > sum(r.placed for r in ff)
    assert sum(k.placed >= f.placed for k, f in zip(kg, ff, strict=True)) >= 5
    assert sum(r.stranded for r in kg) <= sum(r.stranded for r in ff)


def test_the_rule_closest_to_first_fit_on_every_mix_pays_in_whole_node_pods_and_static_mixes() -> None:
    # Why kubegpu does not rank nodes the way the bench's `loosest_replay` does (the README's departures section):
    # it is at least first-fit on each of the six mixes, but gives up whole-node pods to get there, and with no
    # departures it hands the 12-device pods' only inf2.48xlarge to the first 2-device pod, where kubegpu keeps it.
    ff = [bench.first_fit_replay(nodes, events) for _, nodes, events in DEPARTURES]
    rule = [bench.loosest_replay(nodes, events) for _, nodes, events in DEPARTURES]
    assert all(r.placed >= f.placed for r, f in zip(rule, ff, strict=True))
    assert sum(r.large for r in rule) < 0.75 * sum(f.large for f in ff)
    # random-1: pods of 2, 12, 12, 12 and 8 devices on an inf2.24xlarge, a trn1.32xlarge and an inf2.48xlarge.
    _, nodes, sizes = next(w for w in WORKLOADS if w[0] == "random-1")
    assert bench.loosest_replay(nodes, bench.arrivals(sizes)).placed < bench.first_fit(nodes, sizes).placed
    assert bench.kubegpu(nodes, sizes).placed >= bench.first_fit(nodes, sizes).placed


def test_one_decision_other_than_first_fits_costs_a_pod_where_the_next_pod_needed_that_node() -> None:
    # An inf2.24xlarge listed first, then an inf2.48xlarge: first-fit puts the 6-device pod on the first and the
    # 12-device pod that follows on the second; the one other decision (the 6 on the inf2.48xlarge) turns it away.
    nodes = [("inf2-0", "inf2.24xlarge"), ("inf2-1", "inf2.48xlarge")]
    found = bench.one_change(nodes, bench.arrivals([6, 12]), seed=0, points=1, futures=3)
    assert found.deltas == (-1,)
    assert len(found.sampled) == 1 and len(found.sampled[0]) == 3 and found.points == ((0,),)


def test_with_departures_every_mix_has_a_single_decision_that_ends_below_first_fit() -> None:
    # The floor of the goal "at least first-fit on every mix" (docs/benchmarks.md): on each of the issue's six mixes
    # some arrival sent to another node that fits (first-fit before and after) ends with fewer pods placed than
    # first-fit, and as many such changes end above: one decision moves a mix's count either way by several pods.
    changes = [bench.one_change(nodes, events, seed=i, points=0) for i, (_, nodes, events) in enumerate(DEPARTURES)]
    assert all(min(found.deltas) < 0 for found in changes)
    deltas = [delta for found in changes for delta in found.deltas]
    below, above = sum(d < 0 for d in deltas), sum(d > 0 for d in deltas)
    assert below > len(deltas) / 10 and above > len(deltas) / 10
    assert min(deltas) <= -5
