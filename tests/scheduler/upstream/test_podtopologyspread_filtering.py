"""kube-scheduler 1.20's PodTopologySpread filter tables (`TestPreFilterState`, `TestSingleConstraint`,
pkg/scheduler/framework/plugins/podtopologyspread/filtering_test.go), held against kubegpu.

Read at kubernetes/kubernetes commit 01c2588bf4a3eb6bb3524b1e2bd60efb38a4b577, a later copy than 1.20. Its rows with
`minDomains` (1.24+) are not 1.20's and are left out; the others keep 1.20's data and verdicts. Nodes carry the
labels `zone` and `node`; every pod is in `default` unless a namespace is named, and labelled `foo` (or `bar`).

Upstream runs the plugin alone (its PreFilter then Filter), so a node the pod's node affinity refuses still passes
("in real case, it's false"). kubegpu exposes the plugin the same way, as `filters.spread_counts` (PreFilter) and
`filters.spread_fits` (Filter): the table is held against those, and, for rows whose pod has no node affinity,
against the engine's whole filter phase too (`Engine.filter_node`), which must give the same code. PreFilter's
state, matching pods per topology value and the smallest count (the first critical path), is compared with
`SpreadState.counts` and `.minimum`.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.scheduler import filters

from ._kube import case_id, engine, node, pod, verdict

TEST = "TestSingleConstraint"
OK, NO, NEVER = "Success", "Unschedulable", "UnschedulableAndUnresolvable"
FOUR = {"node-a": "zone1", "node-b": "zone1", "node-x": "zone2", "node-y": "zone2"}
FOO = {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}
BAR = {"matchExpressions": [{"key": "bar", "operator": "Exists"}]}
SPREAD_2103 = [("node-a", 2), ("node-b", 1), ("node-y", 3)]


def constraint(skew: int, key: str, selector: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule"}
    if selector is not None:
        out["labelSelector"] = selector
    return out


def nodes_in(zones: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    return [(name, {"zone": zone, "node": name}) for name, zone in zones.items()]


def foo_pods(*counts: tuple[str, int], namespace: str = "default") -> list[tuple[str, str, str, bool]]:
    """(node, namespace, label, terminating) for `count` pods labelled foo on each node."""
    return [(where, namespace, "foo", False) for where, count in counts for _ in range(count)]


# (upstream case name, the pod's label, its constraint, its required node affinity term, nodes (name, labels),
#  existing pods (node, namespace, label, terminating), expected code per node)
Row = tuple[
    str,
    str,
    dict[str, Any],
    dict[str, Any] | None,
    list[tuple[str, dict[str, str]]],
    list[tuple[str, str, str, bool]],
    dict[str, str],
]
CASES: list[Row] = [
    (
        "no existing pods",
        "foo",
        constraint(1, "zone", FOO),
        None,
        nodes_in(FOUR),
        [],
        {"node-a": OK, "node-b": OK, "node-x": OK, "node-y": OK},
    ),
    (
        "no existing pods, incoming pod doesn't match itself",
        "foo",
        constraint(1, "zone", BAR),
        None,
        nodes_in(FOUR),
        [],
        {"node-a": OK, "node-b": OK, "node-x": OK, "node-y": OK},
    ),
    (
        "existing pods in a different namespace do not count",
        "foo",
        constraint(1, "zone", FOO),
        None,
        nodes_in(FOUR),
        foo_pods(("node-a", 1), namespace="ns1")
        + foo_pods(("node-a", 1), namespace="ns2")
        + foo_pods(("node-x", 1), ("node-y", 1)),
        {"node-a": OK, "node-b": OK, "node-x": NO, "node-y": NO},
    ),
    (
        "existing pods do not match null selector",
        "foo",
        constraint(1, "zone", None),
        None,
        nodes_in(FOUR),
        foo_pods(("node-x", 1), ("node-y", 1)),
        {"node-a": OK, "node-b": OK, "node-x": OK, "node-y": OK},
    ),
    (
        "pods spread across zones as 3/3, all nodes fit",
        "foo",
        constraint(1, "zone", FOO),
        None,
        nodes_in(FOUR),
        foo_pods(*SPREAD_2103),
        {"node-a": OK, "node-b": OK, "node-x": OK, "node-y": OK},
    ),
    (
        "pods spread across zones as 1/2 due to absence of label 'zone' on node-b",
        "foo",
        constraint(1, "zone", FOO),
        None,
        [
            ("node-a", {"zone": "zone1", "node": "node-a"}),
            ("node-b", {"zon": "zone1", "node": "node-b"}),
            ("node-x", {"zone": "zone2", "node": "node-x"}),
            ("node-y", {"zone": "zone2", "node": "node-y"}),
        ],
        foo_pods(("node-a", 1), ("node-b", 1), ("node-x", 1), ("node-y", 1)),
        {"node-a": OK, "node-b": NEVER, "node-x": NO, "node-y": NO},
    ),
    (
        "pod cannot be scheduled as all nodes don't have label 'rack'",
        "foo",
        constraint(1, "rack", FOO),
        None,
        nodes_in({"node-a": "zone1", "node-x": "zone2"}),
        [],
        {"node-a": NEVER, "node-x": NEVER},
    ),
    (
        "pods spread across nodes as 2/1/0/3, only node-x fits",
        "foo",
        constraint(1, "node", FOO),
        None,
        nodes_in(FOUR),
        foo_pods(*SPREAD_2103),
        {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": NO},
    ),
    (
        "pods spread across nodes as 2/1/0/3, maxSkew is 2, node-b and node-x fit",
        "foo",
        constraint(2, "node", FOO),
        None,
        nodes_in(FOUR),
        foo_pods(*SPREAD_2103),
        {"node-a": NO, "node-b": OK, "node-x": OK, "node-y": NO},
    ),
    (
        "pods spread across nodes as 2/1/0/3, but pod doesn't match itself",
        "bar",
        constraint(1, "node", FOO),
        None,
        nodes_in(FOUR),
        foo_pods(*SPREAD_2103),
        {"node-a": NO, "node-b": OK, "node-x": OK, "node-y": NO},
    ),
    (
        "incoming pod has nodeAffinity, pods spread as 2/~1~/~0~/3, hence node-a fits",
        "foo",
        constraint(1, "node", FOO),
        {"matchExpressions": [{"key": "node", "operator": "In", "values": ["node-a", "node-y"]}]},
        nodes_in(FOUR),
        foo_pods(*SPREAD_2103),
        {"node-a": OK, "node-b": OK, "node-x": OK, "node-y": NO},
    ),
    (
        "terminating Pods should be excluded",
        "foo",
        constraint(1, "node", FOO),
        None,
        [("node-a", {"node": "node-a"}), ("node-b", {"node": "node-b"})],
        [("node-a", "default", "foo", True), ("node-b", "default", "foo", False)],
        {"node-a": OK, "node-b": NO},
    ),
    (
        "incoming pod has nodeAffinity, pods spread as 0/~2~/0/1, hence node-a fits",
        "foo",
        constraint(1, "zone", FOO),
        {"matchExpressions": [{"key": "node", "operator": "NotIn", "values": ["node-b"]}]},
        nodes_in(FOUR),
        foo_pods(("node-b", 2), ("node-y", 1)),
        {"node-a": OK, "node-b": OK, "node-x": NO, "node-y": NO},
    ),
]

PREFILTER = "TestPreFilterState"
ZONE_FOO, NODE_FOO = constraint(1, "zone", FOO), constraint(1, "node", FOO)
SPREAD_21_02 = [("node-a", 2), ("node-b", 1), ("node-y", 2)]

# (upstream case name, the pod's constraints, nodes (name -> zone), existing foo pods per node and namespace,
#  expected matching pods per topology value for each hard constraint, expected minimum per hard constraint)
PREFILTER_CASES: list[
    tuple[str, list[dict[str, Any]], dict[str, str], list[tuple[str, str, str, bool]], list[dict[str, int]], list[int]]
] = [
    (
        "clean cluster with one spreadConstraint",
        [constraint(5, "zone", {"matchLabels": {"foo": "bar"}})],
        FOUR,
        [],
        [{"zone1": 0, "zone2": 0}],
        [0],
    ),
    (
        "normal case with one spreadConstraint",
        [ZONE_FOO],
        FOUR,
        foo_pods(*SPREAD_21_02),
        [{"zone1": 3, "zone2": 2}],
        [2],
    ),
    (
        "normal case with null label selector",
        [constraint(1, "zone", None)],
        FOUR,
        foo_pods(*SPREAD_21_02),
        [{"zone1": 0, "zone2": 0}],
        [0],
    ),
    (
        "normal case with one spreadConstraint, on a 3-zone cluster",
        [ZONE_FOO],
        {**FOUR, "node-o": "zone3", "node-p": "zone3"},
        foo_pods(*SPREAD_21_02),
        [{"zone1": 3, "zone2": 2, "zone3": 0}],
        [0],
    ),
    (
        "namespace mismatch doesn't count",
        [ZONE_FOO],
        FOUR,
        foo_pods(("node-a", 1), ("node-b", 1), ("node-y", 1))
        + foo_pods(("node-a", 1), namespace="ns1")
        + foo_pods(("node-y", 1), namespace="ns2"),
        [{"zone1": 2, "zone2": 1}],
        [1],
    ),
    (
        "normal case with two spreadConstraints",
        [ZONE_FOO, NODE_FOO],
        FOUR,
        foo_pods(("node-a", 2), ("node-b", 1), ("node-y", 4)),
        [{"zone1": 3, "zone2": 4}, {"node-a": 2, "node-b": 1, "node-x": 0, "node-y": 4}],
        [3, 0],
    ),
    (
        "soft spreadConstraints should be bypassed",
        [
            {**ZONE_FOO, "whenUnsatisfiable": "ScheduleAnyway"},
            ZONE_FOO,
            {**NODE_FOO, "whenUnsatisfiable": "ScheduleAnyway"},
            NODE_FOO,
        ],
        {"node-a": "zone1", "node-b": "zone1", "node-y": "zone2"},
        foo_pods(("node-a", 2), ("node-b", 1), ("node-y", 4)),
        [{"zone1": 3, "zone2": 4}, {"node-a": 2, "node-b": 1, "node-y": 4}],
        [3, 1],
    ),
]

NOT_EXPRESSIBLE: dict[str, str] = {}

CODES = {None: OK, True: NO, False: NEVER}


def incoming(label: str, spread: dict[str, Any], affinity: dict[str, Any] | None) -> Any:
    spec: dict[str, Any] = {"topologySpreadConstraints": [spread]}
    if affinity is not None:
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [affinity]}}
        }
    return pod("p", spec, labels={label: ""})


def existing(rows: list[tuple[str, str, str, bool]]) -> list[tuple[Any, str]]:
    out = []
    for i, (where, namespace, label, terminating) in enumerate(rows):
        meta: dict[str, Any] = {"namespace": namespace, "labels": {label: ""}}
        if terminating:
            meta["deletionTimestamp"] = "2020-12-01T00:00:00Z"
        out.append((pod(f"p-{i}", {"nodeName": where}, **meta), where))
    return out


# A node lacking the constraint's topology key is UnschedulableAndUnresolvable in the engine too; a spread plan never
# settles a node class (`Plan.settles`).
ENGINE_XFAIL: dict[str, str] = {}


def answers(probe: Any, nodes: list[tuple[str, dict[str, str]]], pods: list[tuple[Any, str]]) -> dict[str, str]:
    on = {name: [p for p, where in pods if where == name] for name, _ in nodes}
    state = filters.spread_counts(probe, [(name, labels, on[name]) for name, labels in nodes])
    got = {}
    for name, labels in nodes:
        answer = filters.spread_fits(probe, state, labels)
        got[name] = CODES[None if answer is None else answer[1]]
    return got


@pytest.mark.parametrize(
    ("label", "spread", "affinity", "nodes", "placed", "expected"),
    [pytest.param(*c[1:], id=case_id(TEST, c[0])) for c in CASES],
)
def test_single_constraint(
    label: str,
    spread: dict[str, Any],
    affinity: dict[str, Any] | None,
    nodes: list[tuple[str, dict[str, str]]],
    placed: list[tuple[str, str, str, bool]],
    expected: dict[str, str],
) -> None:
    assert answers(incoming(label, spread, affinity), nodes, existing(placed)) == expected


@pytest.mark.parametrize(
    ("label", "spread", "nodes", "placed", "expected"),
    [
        pytest.param(
            c[1],
            c[2],
            *c[4:],
            id=case_id(TEST, c[0]),
            marks=[pytest.mark.xfail(strict=True, reason=ENGINE_XFAIL[c[0]])] if c[0] in ENGINE_XFAIL else [],
        )
        for c in CASES
        if c[3] is None  # the engine runs NodeAffinity too: rows with node affinity are the plugin's alone
    ],
)
def test_single_constraint_in_the_engine(
    label: str,
    spread: dict[str, Any],
    nodes: list[tuple[str, dict[str, str]]],
    placed: list[tuple[str, str, str, bool]],
    expected: dict[str, str],
) -> None:
    probe, pods = incoming(label, spread, None), existing(placed)
    e = engine([node(name, labels=labels) for name, labels in nodes], pods)
    assert {name: verdict(e.filter_node(name, probe))[0] for name, _ in nodes} == expected


@pytest.mark.parametrize(
    ("spread", "zones", "placed", "counts", "minimum"),
    [pytest.param(*c[1:], id=case_id(PREFILTER, c[0])) for c in PREFILTER_CASES],
)
def test_prefilter_state(
    spread: list[dict[str, Any]],
    zones: dict[str, str],
    placed: list[tuple[str, str, str, bool]],
    counts: list[dict[str, int]],
    minimum: list[int],
) -> None:
    probe = pod("p", {"topologySpreadConstraints": spread}, labels={"foo": ""})
    pods = existing(placed)
    state = filters.spread_counts(
        probe, [(name, labels, [p for p, where in pods if where == name]) for name, labels in nodes_in(zones)]
    )
    assert list(state.counts) == counts
    assert list(state.minimum) == minimum


# `TestMultipleConstraints`: two DoNotSchedule constraints, on `zone` and on `node`, read in a copy of 1.20's
# scheduler (github.com/Mr-Linus/Mandalorian at a68905bea7be30dbb1ea041ea13311f36d6c740a); every row is 1.20's.
MULTIPLE = "TestMultipleConstraints"
FOUR_NODES = nodes_in(FOUR)
FOUR_NODES_X_UNLABELLED = [(n, labels if n != "node-x" else {"zone": "zone2"}) for n, labels in FOUR_NODES]
# (upstream case name, the pod's labels, the selected label of its zone and node constraints, nodes, existing pods
#  (node, labels), expected code per node)
MultipleRow = tuple[
    str, tuple[str, ...], tuple[str, str], list[tuple[str, dict[str, str]]], list[tuple[str, tuple[str, ...]]],
    dict[str, str],
]  # fmt: skip
MULTIPLE_CASES: list[MultipleRow] = [
    ("two Constraints on zone and node, spreads = [3/3, 2/1/0/3]", ("foo",), ("foo", "foo"), FOUR_NODES,
     [("node-a", ("foo",))] * 2 + [("node-b", ("foo",))] + [("node-y", ("foo",))] * 3,
     {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": NO}),
    ("two Constraints on zone and node, spreads = [3/4, 2/1/0/4]", ("foo",), ("foo", "foo"), FOUR_NODES,
     [("node-a", ("foo",))] * 2 + [("node-b", ("foo",))] + [("node-y", ("foo",))] * 4,
     {"node-a": NO, "node-b": NO, "node-x": NO, "node-y": NO}),
    ("Constraints hold different labelSelectors, spreads = [1/0, 1/0/0/1]", ("foo", "bar"), ("foo", "bar"),
     FOUR_NODES, [("node-a", ("foo",)), ("node-y", ("bar",))],
     {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": NO}),
    ("Constraints hold different labelSelectors, spreads = [1/0, 0/0/1/1]", ("foo", "bar"), ("foo", "bar"),
     FOUR_NODES, [("node-a", ("foo",)), ("node-x", ("bar",)), ("node-y", ("bar",))],
     {"node-a": NO, "node-b": NO, "node-x": NO, "node-y": NO}),
    ("Constraints hold different labelSelectors, spreads = [2/3, 1/0/0/1]", ("foo", "bar"), ("foo", "bar"),
     FOUR_NODES,
     [("node-a", ("foo",)), ("node-a", ("foo", "bar")), ("node-y", ("foo",)), ("node-y", ("foo", "bar")),
      ("node-y", ("foo",))],
     {"node-a": NO, "node-b": OK, "node-x": NO, "node-y": NO}),
    ("Constraints hold different labelSelectors but pod doesn't match itself on 'zone' constraint", ("bar",),
     ("foo", "bar"), FOUR_NODES, [("node-a", ("foo",)), ("node-x", ("bar",)), ("node-y", ("bar",))],
     {"node-a": OK, "node-b": OK, "node-x": NO, "node-y": NO}),
    ("two Constraints on zone and node, absence of label 'node' on node-x, spreads = [1/1, 1/0/0/1]", ("foo",),
     ("foo", "foo"), FOUR_NODES_X_UNLABELLED, [("node-a", ("foo",)), ("node-y", ("foo",))],
     {"node-a": NO, "node-b": OK, "node-x": NEVER, "node-y": NO}),
]  # fmt: skip
MULTIPLE_ENGINE_XFAIL: dict[str, str] = {}


def two_constraints(labels: tuple[str, ...], selected: tuple[str, str]) -> Any:
    spread = [
        constraint(1, "zone", {"matchExpressions": [{"key": selected[0], "operator": "Exists"}]}),
        constraint(1, "node", {"matchExpressions": [{"key": selected[1], "operator": "Exists"}]}),
    ]
    return pod("p", {"topologySpreadConstraints": spread}, labels={label: "" for label in labels})


def labelled(rows: list[tuple[str, tuple[str, ...]]]) -> list[tuple[Any, str]]:
    return [
        (pod(f"p-{i}", {"nodeName": where}, labels={label: "" for label in labels}), where)
        for i, (where, labels) in enumerate(rows)
    ]


@pytest.mark.parametrize(
    ("labels", "selected", "nodes", "placed", "expected"),
    [pytest.param(*c[1:], id=case_id(MULTIPLE, c[0])) for c in MULTIPLE_CASES],
)
def test_multiple_constraints(
    labels: tuple[str, ...],
    selected: tuple[str, str],
    nodes: list[tuple[str, dict[str, str]]],
    placed: list[tuple[str, tuple[str, ...]]],
    expected: dict[str, str],
) -> None:
    assert answers(two_constraints(labels, selected), nodes, labelled(placed)) == expected


@pytest.mark.parametrize(
    ("labels", "selected", "nodes", "placed", "expected"),
    [
        pytest.param(
            *c[1:],
            id=case_id(MULTIPLE, c[0])
            + (" [xfail: unresolvable read as unschedulable]" if c[0] in MULTIPLE_ENGINE_XFAIL else ""),
            marks=[pytest.mark.xfail(strict=True, reason=MULTIPLE_ENGINE_XFAIL[c[0]])]
            if c[0] in MULTIPLE_ENGINE_XFAIL
            else [],
        )
        for c in MULTIPLE_CASES
    ],
)
def test_multiple_constraints_in_the_engine(
    labels: tuple[str, ...],
    selected: tuple[str, str],
    nodes: list[tuple[str, dict[str, str]]],
    placed: list[tuple[str, tuple[str, ...]]],
    expected: dict[str, str],
) -> None:
    e = engine([node(name, labels=node_labels) for name, node_labels in nodes], labelled(placed))
    probe = two_constraints(labels, selected)
    assert {name: verdict(e.filter_node(name, probe))[0] for name, _ in nodes} == expected
