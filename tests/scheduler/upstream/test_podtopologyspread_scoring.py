"""kube-scheduler 1.20's PodTopologySpread score table (`TestPodTopologySpreadScore`,
pkg/scheduler/framework/plugins/podtopologyspread/scoring_test.go), held against kubegpu.

Read in a copy of 1.20's scheduler (the framework's `New(args, handle)` and `PreScore(ctx, state, pod, nodes)` of
1.20, `SpreadConstraint(skew, key, when, selector)` with four arguments): github.com/Mr-Linus/Mandalorian at
a68905bea7be30dbb1ea041ea13311f36d6c740a. Every row is 1.20's; none is left out.

Upstream scores the candidate nodes (`nodes`) with the existing pods on every node of the snapshot (`nodes` and
`failedNodes`): a node that failed the filters still counts its pods. kubegpu exposes the plugin as
`scores.spread_prescore` (PreScore), `scores.spread_raw` (Score) and `scores.normalize_spread` (NormalizeScore):
the table's numbers are compared with those. The engine, scoring with PodTopologySpread alone and the failed nodes
cordoned (their pods still counted, as bound pods are), must pick one of the nodes the table scores highest.

Every constraint is `ScheduleAnyway` and selects the pods that carry a label (`Exists`); nodes are labelled with the
hostname key `kubernetes.io/hostname` and, where upstream says so, `zone`.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.scheduler import scores

from ._kube import case_id, engine, node, pod

TEST = "TestPodTopologySpreadScore"
HOST = "kubernetes.io/hostname"


def hosts(*names: str, zones: dict[str, str] | None = None) -> list[tuple[str, dict[str, str]]]:
    """Nodes labelled with their hostname and, when `zones` names them, their zone."""
    out = []
    for name in names:
        labels = {HOST: name}
        if zones and name in zones:
            labels["zone"] = zones[name]
        out.append((name, labels))
    return out


def spread(*counts: tuple[str, int], label: str = "foo") -> list[tuple[str, dict[str, str], str, bool]]:
    """`count` existing pods labelled `label` on each node: (node, labels, namespace, terminating)."""
    return [(where, {label: ""}, "default", False) for where, count in counts for _ in range(count)]


ZONES = {"node-a": "zone1", "node-b": "zone1", "node-x": "zone2", "node-y": "zone2"}
# (upstream case name, the incoming pod's labels, its constraints (maxSkew, topologyKey, selected label), the
#  candidate nodes, the failed nodes, the existing pods (node, labels, namespace, terminating), expected scores)
Row = tuple[
    str,
    list[str],
    list[tuple[int, str, str]],
    list[tuple[str, dict[str, str]]],
    list[tuple[str, dict[str, str]]],
    list[tuple[str, dict[str, str], str, bool]],
    dict[str, int],
]
CASES: list[Row] = [
    ("one constraint on node, no existing pods", ["foo"], [(1, HOST, "foo")], hosts("node-a", "node-b"), [], [],
     {"node-a": 100, "node-b": 100}),
    ("one constraint on node, only one node is candidate", ["foo"], [(1, HOST, "foo")], hosts("node-a"),
     hosts("node-b"), spread(("node-a", 2), ("node-b", 1)), {"node-a": 100}),
    ("one constraint on node, all nodes have the same number of matching pods", ["foo"], [(1, HOST, "foo")],
     hosts("node-a", "node-b"), [], spread(("node-a", 1), ("node-b", 1)), {"node-a": 100, "node-b": 100}),
    ("one constraint on node, all 4 nodes are candidates", ["foo"], [(1, HOST, "foo")],
     hosts("node-a", "node-b", "node-c", "node-d"), [], spread(("node-a", 2), ("node-b", 1), ("node-d", 3)),
     {"node-a": 40, "node-b": 80, "node-c": 100, "node-d": 0}),
    ("one constraint on node, all 4 nodes are candidates, maxSkew=2", ["foo"], [(2, HOST, "foo")],
     hosts("node-a", "node-b", "node-c", "node-d"), [], spread(("node-a", 2), ("node-b", 1), ("node-d", 3)),
     {"node-a": 50, "node-b": 83, "node-c": 100, "node-d": 16}),
    ("one constraint on node, all 4 nodes are candidates, maxSkew=3", ["foo"], [(3, HOST, "foo")],
     hosts("node-a", "node-b", "node-c", "node-d"), [],
     spread(("node-a", 4), ("node-b", 3), ("node-c", 2), ("node-d", 1)),
     {"node-a": 33, "node-b": 55, "node-c": 77, "node-d": 100}),
    ("one constraint on node, 3 out of 4 nodes are candidates", ["foo"], [(1, HOST, "foo")],
     hosts("node-a", "node-b", "node-x"), hosts("node-y"),
     spread(("node-a", 4), ("node-b", 2), ("node-x", 1), ("node-y", 3)), {"node-a": 16, "node-b": 66, "node-x": 100}),
    ("one constraint on node, 3 out of 4 nodes are candidates, one node doesn't match topology key", ["foo"],
     [(1, HOST, "foo")], [("node-a", {HOST: "node-a"}), ("node-b", {"n": "node-b"}), ("node-x", {HOST: "node-x"})],
     hosts("node-y"), spread(("node-a", 4), ("node-b", 2), ("node-x", 1), ("node-y", 3)),
     {"node-a": 20, "node-b": 0, "node-x": 100}),
    ("one constraint on zone, 3 out of 4 nodes are candidates", ["foo"], [(1, "zone", "foo")],
     hosts("node-a", "node-b", "node-x", zones=ZONES), hosts("node-y", zones=ZONES),
     spread(("node-a", 4), ("node-b", 2), ("node-x", 1), ("node-y", 3)), {"node-a": 62, "node-b": 62, "node-x": 100}),
    ("two Constraints on zone and node, 2 out of 4 nodes are candidates", ["foo"],
     [(1, "zone", "foo"), (1, HOST, "foo")], hosts("node-a", "node-x", zones=ZONES),
     hosts("node-b", "node-y", zones=ZONES), spread(("node-a", 2), ("node-b", 1), ("node-x", 2), ("node-y", 4)),
     {"node-a": 100, "node-x": 54}),
    ("two Constraints on zone and node, with different labelSelectors", ["foo", "bar"],
     [(1, "zone", "foo"), (1, HOST, "bar")], hosts("node-a", "node-b", "node-x", "node-y", zones=ZONES), [],
     [("node-a", {"foo": ""}, "default", False), ("node-b", {"foo": "", "bar": ""}, "default", False),
      ("node-y", {"foo": ""}, "default", False), ("node-y", {"bar": ""}, "default", False)],
     {"node-a": 75, "node-b": 25, "node-x": 100, "node-y": 50}),
    ("two Constraints on zone and node, with different labelSelectors, some nodes have 0 pods", ["foo", "bar"],
     [(1, "zone", "foo"), (1, HOST, "bar")], hosts("node-a", "node-b", "node-x", "node-y", zones=ZONES), [],
     [("node-b", {"bar": ""}, "default", False), ("node-x", {"foo": ""}, "default", False),
      ("node-y", {"foo": "", "bar": ""}, "default", False)],
     {"node-a": 100, "node-b": 75, "node-x": 50, "node-y": 0}),
    ("two Constraints on zone and node, with different labelSelectors, 3 out of 4 nodes are candidates",
     ["foo", "bar"], [(1, "zone", "foo"), (1, HOST, "bar")], hosts("node-a", "node-b", "node-x", zones=ZONES),
     hosts("node-y", zones=ZONES),
     [("node-a", {"foo": ""}, "default", False), ("node-b", {"foo": "", "bar": ""}, "default", False),
      ("node-y", {"foo": ""}, "default", False), ("node-y", {"bar": ""}, "default", False)],
     {"node-a": 75, "node-b": 25, "node-x": 100}),
    ("existing pods in a different namespace do not count", ["foo"], [(1, HOST, "foo")], hosts("node-a", "node-b"),
     [], [("node-a", {"foo": ""}, "ns1", False), *spread(("node-a", 1), ("node-b", 2))],
     {"node-a": 100, "node-b": 50}),
    ("terminating Pods should be excluded", ["foo"], [(1, HOST, "foo")], hosts("node-a", "node-b"), [],
     [("node-a", {"foo": ""}, "default", True), ("node-b", {"foo": ""}, "default", False)],
     {"node-a": 100, "node-b": 0}),
]  # fmt: skip
NOT_EXPRESSIBLE: dict[str, str] = {}


def incoming(labels: list[str], constraints: list[tuple[int, str, str]]) -> Any:
    spec = {
        "topologySpreadConstraints": [
            {"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchExpressions": [{"key": label, "operator": "Exists"}]}}
            for skew, key, label in constraints
        ]
    }  # fmt: skip
    return pod("p", spec, labels={label: "" for label in labels})


def existing(rows: list[tuple[str, dict[str, str], str, bool]]) -> list[tuple[Any, str]]:
    out = []
    for i, (where, labels, namespace, terminating) in enumerate(rows):
        meta: dict[str, Any] = {"namespace": namespace, "labels": labels}
        if terminating:
            meta["deletionTimestamp"] = "2020-12-01T00:00:00Z"
        out.append((pod(f"p-{i}", {"nodeName": where}, **meta), where))
    return out


def plugin_scores(probe: Any, candidates: list[tuple[str, dict[str, str]]], every: list[tuple[str, dict[str, str]]],
                  pods: list[tuple[Any, str]]) -> dict[str, int]:  # fmt: skip
    on = {name: [p for p, where in pods if where == name] for name, _ in every}
    state = scores.spread_prescore(probe, candidates, [(name, labels, on[name]) for name, labels in every])
    assert state is not None
    raw = [scores.spread_raw(state, probe, name, labels, on[name]) for name, labels in candidates]
    normalized = scores.normalize_spread(raw, [name in state.ignored for name, _ in candidates])
    return {name: score for (name, _), score in zip(candidates, normalized, strict=True)}


PARAMS = [pytest.param(*c[1:], id=case_id(TEST, c[0])) for c in CASES]
ARGS = ("labels", "constraints", "candidates", "failed", "placed", "expected")


@pytest.mark.parametrize(ARGS, PARAMS)
def test_pod_topology_spread_score(
    labels: list[str],
    constraints: list[tuple[int, str, str]],
    candidates: list[tuple[str, dict[str, str]]],
    failed: list[tuple[str, dict[str, str]]],
    placed: list[tuple[str, dict[str, str], str, bool]],
    expected: dict[str, int],
) -> None:
    probe = incoming(labels, constraints)
    assert plugin_scores(probe, candidates, [*candidates, *failed], existing(placed)) == expected


@pytest.mark.parametrize(ARGS, PARAMS)
def test_pod_topology_spread_score_in_the_engine(
    labels: list[str],
    constraints: list[tuple[int, str, str]],
    candidates: list[tuple[str, dict[str, str]]],
    failed: list[tuple[str, dict[str, str]]],
    placed: list[tuple[str, dict[str, str], str, bool]],
    expected: dict[str, int],
) -> None:
    nodes = [node(name, labels=node_labels) for name, node_labels in candidates]
    nodes += [node(name, labels=node_labels, unschedulable=True) for name, node_labels in failed]
    e = engine(nodes, existing(placed), profile=scores.Profile({scores.SPREAD: 1}))
    decision = e.decide(incoming(labels, constraints))
    best = max(expected.values())
    assert decision.node in {name for name, score in expected.items() if score == best}
