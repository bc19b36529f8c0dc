"""kube-scheduler's PodTopologySpread rows for the fields 1.24-1.33 added (`TestPreFilterState`, `TestSingleConstraint`,
pkg/scheduler/framework/plugins/podtopologyspread/filtering_test.go), held against kubegpu.

Read at kubernetes/kubernetes commit 01c2588bf4a3eb6bb3524b1e2bd60efb38a4b577 (after 1.34): `minDomains` (GA 1.30),
`nodeAffinityPolicy`/`nodeTaintsPolicy` (GA 1.33; the rows upstream runs with the feature gate on, which is every
release since 1.26), `matchLabelKeys` (beta and on since 1.27; the rows with the gate on). The 1.20 rows stay in
`test_podtopologyspread_filtering.py`. Each pod is a manifest fragment in the exact upstream shape, read by the decoder
the scheduler uses (`pod_request`), so the fields' names and values are checked too.

Upstream runs the plugin alone (its PreFilter then Filter), so a node the pod's node affinity or an untolerated taint
refuses still passes there ("in real case, it's false"); kubegpu's plugin is `filters.spread_counts` and
`filters.spread_fits`. Rows whose pod has no node affinity, no node selector and no tainted node run through the
engine's whole filter phase too (`Engine.filter_node`), which must give the same codes.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.manifests import node_info
from kubegpu.scheduler import filters, podindex

from ._kube import case_id, engine, node, pod, verdict

OK, NO, NEVER = "Success", "Unschedulable", "UnschedulableAndUnresolvable"
CODES = {None: OK, True: NO, False: NEVER}
FOO = {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}
BAR = {"matchExpressions": [{"key": "bar", "operator": "Exists"}]}
TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}  # upstream's `taints`
TOLERATE = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
SELECT_FOO = {"nodeSelector": {"foo": ""}}
AFFINITY_FOO = {
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "foo", "operator": "In", "values": [""]}]}]
            }
        }
    }
}


def spread(skew: int, key: str, selector: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    """One constraint as `st.MakePod().SpreadConstraint(...)` builds it: DoNotSchedule, and the later fields named."""
    out: dict[str, Any] = {"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule", **fields}
    if selector is not None:
        out["labelSelector"] = selector
    return out


def n(name: str, tainted: bool = False, **labels: str) -> tuple[str, dict[str, str], bool]:
    return name, labels, tainted


def on(where: str, **labels: str) -> tuple[str, dict[str, str]]:
    """An existing pod on a node, with its labels."""
    return where, labels


FOUR = [
    n("node-a", zone="zone1", node="node-a"),
    n("node-b", zone="zone1", node="node-b"),
    n("node-x", zone="zone2", node="node-x"),
    n("node-y", zone="zone2", node="node-y"),
]
ABC = [n("node-a", node="node-a"), n("node-b", node="node-b"), n("node-c", node="node-c")]
FOO_4 = [n("node-a", node="node-a", foo=""), n("node-b", node="node-b", foo=""), n("node-x", node="node-x", foo="")]
ONE_ONE_ZERO = [on("node-a", foo=""), on("node-b", foo=""), on("node-y", foo="")]

# (upstream case name, pod labels, extra pod spec, constraints, nodes (name, labels, tainted), existing pods
#  (node, labels), expected code per node)
SINGLE_CASES: list[
    tuple[str, dict[str, str], dict[str, Any], list[dict[str, Any]], list[Any], list[Any], dict[str, str]]
] = [
    (
        "pods spread across nodes as 2/2/1, maxSkew is 2, and the number of domains < minDomains, then the third node "
        "fits",
        {"foo": ""},
        {},
        [spread(2, "node", FOO, minDomains=4)],
        ABC,
        [on("node-a", foo=""), on("node-a", foo=""), on("node-b", foo=""), on("node-b", foo=""), on("node-c", foo="")],
        {"node-a": NO, "node-b": NO, "node-c": OK},
    ),
    (
        "pods spread across nodes as 2/2/1, maxSkew is 2, and the number of domains > minDomains, then the all nodes "
        "fit",
        {"foo": ""},
        {},
        [spread(2, "node", FOO, minDomains=2)],
        ABC,
        [on("node-a", foo=""), on("node-a", foo=""), on("node-b", foo=""), on("node-b", foo=""), on("node-c", foo="")],
        {"node-a": OK, "node-b": OK, "node-c": OK},
    ),
    (
        "pods spread across zone as 2/1, maxSkew is 2 and the number of domains < minDomains, then the third and "
        "fourth nodes fit",
        {"foo": ""},
        {},
        [spread(2, "zone", FOO, minDomains=3)],
        FOUR,
        [on("node-a", foo=""), on("node-b", foo=""), on("node-y", foo="")],
        {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": OK},
    ),
    (
        "pods spread across zone as 2/1, maxSkew is 2 and the number of domains > minDomains, then the all nodes fit",
        {"foo": ""},
        {},
        [spread(2, "zone", FOO, minDomains=1)],
        FOUR,
        [on("node-a", foo=""), on("node-b", foo=""), on("node-y", foo="")],
        {"node-a": OK, "node-b": OK, "node-x": OK, "node-y": OK},
    ),
    (
        "NodeAffinityPolicy honored with labelSelectors",
        {"foo": ""},
        SELECT_FOO,
        [spread(1, "node", FOO)],
        [*FOO_4, n("node-y", node="node-y")],
        ONE_ONE_ZERO,
        {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": OK},
    ),
    (
        "NodeAffinityPolicy ignored with labelSelectors",
        {"foo": ""},
        SELECT_FOO,
        [spread(1, "node", FOO, nodeAffinityPolicy="Ignore")],
        [*FOO_4, n("node-y", node="node-y")],
        ONE_ONE_ZERO,
        {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": NO},
    ),
    (
        "NodeAffinityPolicy honored with nodeAffinity",
        {"foo": ""},
        AFFINITY_FOO,
        [spread(1, "node", FOO)],
        [*FOO_4, n("node-y", node="node-y")],
        ONE_ONE_ZERO,
        {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": OK},
    ),
    (
        "NodeAffinityPolicy ignored with labelSelectors (the second row of that name: node affinity)",
        {"foo": ""},
        AFFINITY_FOO,
        [spread(1, "node", FOO, nodeAffinityPolicy="Ignore")],
        [*FOO_4, n("node-y", node="node-y")],
        ONE_ONE_ZERO,
        {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": NO},
    ),
    (
        "NodeTaintsPolicy honored",
        {"foo": ""},
        {},
        [spread(1, "node", FOO, nodeTaintsPolicy="Honor")],
        [*FOO_4, n("node-y", True, node="node-y")],
        ONE_ONE_ZERO,
        {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": OK},
    ),
    (
        "NodeTaintsPolicy ignored",
        {"foo": ""},
        {},
        [spread(1, "node", FOO)],
        [*FOO_4, n("node-y", True, node="node-y")],
        ONE_ONE_ZERO,
        {"node-a": NO, "node-b": NO, "node-x": OK, "node-y": NO},
    ),
]

# (upstream case name, pod labels, extra pod spec, constraints, nodes, existing pods, expected matching pods per
#  topology value for each constraint, expected global minimum per constraint)
PREFILTER_CASES: list[
    tuple[
        str, dict[str, str], dict[str, Any], list[dict[str, Any]], list[Any], list[Any], list[dict[str, int]], list[int]
    ]
] = [
    (
        "NodeAffinityPolicy ignored with nodeAffinity",
        {"foo": ""},
        AFFINITY_FOO,
        [spread(1, "node", BAR, nodeAffinityPolicy="Ignore")],
        [n("node-a", node="node-a", foo=""), n("node-b", node="node-b", foo=""), n("node-c", node="node-c", bar="")],
        [on("node-a", bar=""), on("node-b", bar=""), on("node-b", bar=""), on("node-c")],
        [{"node-a": 1, "node-b": 2, "node-c": 0}],
        [0],
    ),
    (
        "NodeTaintsPolicy ignored",
        {"foo": ""},
        {},
        [spread(1, "node", BAR)],
        [n("node-a", node="node-a"), n("node-b", node="node-b"), n("node-c", True, node="node-c", bar="")],
        [on("node-a", bar=""), on("node-b", bar=""), on("node-b", bar=""), on("node-c")],
        [{"node-a": 1, "node-b": 2, "node-c": 0}],
        [0],
    ),
    (
        "NodeTaintsPolicy honored",
        {"foo": ""},
        {},
        [spread(1, "node", BAR, nodeTaintsPolicy="Honor")],
        [n("node-a", node="node-a"), n("node-b", node="node-b"), n("node-c", True, node="node-c", bar="")],
        [on("node-a", bar=""), on("node-b", bar=""), on("node-b", bar=""), on("node-c")],
        [{"node-a": 1, "node-b": 2}],
        [1],
    ),
    (
        "NodeTaintsPolicy honored with tolerated taints",
        {"foo": ""},
        {"tolerations": [TOLERATE]},
        [spread(1, "node", BAR, nodeTaintsPolicy="Honor")],
        [n("node-a", node="node-a"), n("node-b", node="node-b"), n("node-c", True, node="node-c", bar="")],
        [on("node-a", bar=""), on("node-b", bar=""), on("node-b", bar=""), on("node-c")],
        [{"node-a": 1, "node-b": 2, "node-c": 0}],
        [0],
    ),
    (
        "two node inclusion Constraints, zone: honor/ignore, node: ignore/ignore",
        {"foo": ""},
        SELECT_FOO,
        [spread(1, "zone", FOO), spread(1, "node", FOO, nodeAffinityPolicy="Ignore")],
        [
            n("node-a", zone="zone1", node="node-a", foo=""),
            n("node-b", zone="zone1", node="node-b"),
            n("node-x", zone="zone2", node="node-x", foo=""),
        ],
        [on("node-b", foo=""), on("node-b", foo=""), on("node-x", foo="")],
        [{"zone1": 0, "zone2": 1}, {"node-a": 0, "node-b": 2, "node-x": 1}],
        [0, 0],
    ),
    (
        "two node inclusion Constraints, zone: honor/honor, node: honor/ignore",
        {"foo": ""},
        {},
        [spread(1, "zone", FOO, nodeTaintsPolicy="Honor"), spread(1, "node", FOO)],
        [
            n("node-a", zone="zone1", node="node-a", foo=""),
            n("node-b", True, zone="zone1", node="node-b"),
            n("node-x", zone="zone2", node="node-x", foo=""),
        ],
        [on("node-b", foo=""), on("node-b", foo=""), on("node-x", foo="")],
        [{"zone1": 0, "zone2": 1}, {"node-a": 0, "node-b": 2, "node-x": 1}],
        [0, 0],
    ),
    (
        "two node inclusion Constraints, zone: honor/ignore, node: honor/ignore",
        {"foo": ""},
        SELECT_FOO,
        [spread(1, "zone", FOO), spread(1, "node", FOO)],
        [
            n("node-a", zone="zone1", node="node-a"),
            n("node-b", True, zone="zone1", node="node-b", foo=""),
            n("node-x", zone="zone2", node="node-x", foo=""),
            n("node-y", zone="zone2", node="node-y"),
        ],
        [on("node-a", foo=""), on("node-a", foo=""), on("node-x", foo=""), on("node-y", foo="")],
        [{"zone1": 0, "zone2": 1}, {"node-b": 0, "node-x": 1}],
        [0, 0],
    ),
    (
        "two node inclusion Constraints, zone: ignore/ignore, node: honor/honor",
        {"foo": ""},
        SELECT_FOO,
        [spread(1, "zone", FOO, nodeAffinityPolicy="Ignore"), spread(1, "node", FOO, nodeTaintsPolicy="Honor")],
        [
            n("node-a", zone="zone1", node="node-a"),
            n("node-b", True, zone="zone1", node="node-b", foo=""),
            n("node-x", zone="zone2", node="node-x", foo=""),
            n("node-y", zone="zone2", node="node-y", foo=""),
        ],
        [on("node-a", foo=""), on("node-a", foo=""), on("node-x", foo=""), on("node-x", foo=""), on("node-y", foo="")],
        [{"zone1": 2, "zone2": 3}, {"node-x": 2, "node-y": 1}],
        [2, 1],
    ),
    (
        "matchLabelKeys ANDed with LabelSelector when LabelSelector isn't empty",
        {"foo": "", "bar": "a"},
        {},
        [spread(1, "zone", FOO, matchLabelKeys=["bar"])],
        FOUR,
        [
            on("node-a", foo=""),
            on("node-a", foo="", bar="a"),
            on("node-b", foo=""),
            on("node-y", foo="", bar="a"),
            on("node-y", bar=""),
        ],
        [{"zone1": 1, "zone2": 1}],
        [1],
    ),
    (
        "matchLabelKeys ANDed with LabelSelector when LabelSelector is empty",
        {"foo": "a"},
        {},
        [spread(1, "zone", {}, matchLabelKeys=["foo"])],
        FOUR,
        [
            on("node-a", foo="a"),
            on("node-a", foo="a"),
            on("node-b", foo="a"),
            on("node-y", foo="a"),
            on("node-y", foo="a"),
        ],
        [{"zone1": 3, "zone2": 2}],
        [2],
    ),
    (
        "key in matchLabelKeys is ignored when LabelSelector is nil when feature gate enabled",
        {"foo": ""},
        {},
        [spread(1, "zone", None, matchLabelKeys=["bar"])],
        FOUR,
        [
            on("node-a", foo="a"),
            on("node-a", foo="a"),
            on("node-b", foo="a"),
            on("node-y", foo="a"),
            on("node-y", foo="a"),
        ],
        [{"zone1": 0, "zone2": 0}],
        [0],
    ),
    (
        "key in matchLabelKeys is ignored when it isn't exist in pod.labels",
        {"foo": ""},
        {},
        [spread(1, "zone", FOO, matchLabelKeys=["bar"])],
        FOUR,
        [
            on("node-a", foo="a"),
            on("node-a", foo="a"),
            on("node-b", foo="a"),
            on("node-y", foo="a"),
            on("node-y", foo="a"),
        ],
        [{"zone1": 3, "zone2": 2}],
        [2],
    ),
]

GATE_OFF = "a row with a feature gate off: kubegpu reads the field as every release since the gate went on by default"
NOT_EXPRESSIBLE: dict[str, str] = {
    "TestPreFilterState/feature gate disabled with NodeTaintsPolicy": GATE_OFF,
    "TestPreFilterState/matchLabelKeys ignored when feature gate disabled": GATE_OFF,
    "TestPreFilterState/no pod is matched when LabelSelector is nil when feature gate disabled": GATE_OFF,
}


def incoming(labels: dict[str, str], extra: dict[str, Any], constraints: list[dict[str, Any]]) -> Any:
    return pod("p", {**extra, "topologySpreadConstraints": constraints}, labels=labels)


def existing(rows: list[tuple[str, dict[str, str]]]) -> list[tuple[Any, str]]:
    return [(pod(f"p-{i}", {"nodeName": where}, labels=labels), where) for i, (where, labels) in enumerate(rows)]


def prefilter(probe: Any, nodes: list[Any], placed: list[tuple[Any, str]]) -> filters.SpreadState:
    """The plugin's PreFilter over the nodes, each read from its manifest (its taints too)."""
    infos = {
        name: node_info(node(name, labels=labels, taints=[TAINT] if tainted else [])) for name, labels, tainted in nodes
    }
    rows = [(name, info.labels, [p for p, where in placed if where == name]) for name, info in infos.items()]
    return filters.spread_counts(probe, rows, None, {name: info.taints for name, info in infos.items()})


@pytest.mark.parametrize(
    ("labels", "extra", "constraints", "nodes", "placed", "expected"),
    [pytest.param(*c[1:], id=case_id("TestSingleConstraint", c[0])) for c in SINGLE_CASES],
)
def test_single_constraint(
    labels: dict[str, str],
    extra: dict[str, Any],
    constraints: list[dict[str, Any]],
    nodes: list[Any],
    placed: list[tuple[str, dict[str, str]]],
    expected: dict[str, str],
) -> None:
    probe = incoming(labels, extra, constraints)
    state = prefilter(probe, nodes, existing(placed))
    got = {}
    for name, node_labels, _ in nodes:
        answer = filters.spread_fits(probe, state, node_labels)
        got[name] = CODES[None if answer is None else answer[1]]
    assert got == expected


@pytest.mark.parametrize(
    ("labels", "constraints", "nodes", "placed", "expected"),
    [
        pytest.param(c[1], c[3], *c[4:], id=case_id("TestSingleConstraint", c[0]))
        for c in SINGLE_CASES
        if not c[2] and not any(tainted for _, _, tainted in c[4])
    ],
)
def test_single_constraint_in_the_engine(
    labels: dict[str, str],
    constraints: list[dict[str, Any]],
    nodes: list[Any],
    placed: list[tuple[str, dict[str, str]]],
    expected: dict[str, str],
) -> None:
    probe = incoming(labels, {}, constraints)
    e = engine([node(name, labels=node_labels) for name, node_labels, _ in nodes], existing(placed))
    assert {name: verdict(e.filter_node(name, probe))[0] for name, _, _ in nodes} == expected


@pytest.mark.parametrize(
    ("labels", "extra", "constraints", "nodes", "placed", "counts", "minimum"),
    [pytest.param(*c[1:], id=case_id("TestPreFilterState", c[0])) for c in PREFILTER_CASES],
)
def test_prefilter_state(
    labels: dict[str, str],
    extra: dict[str, Any],
    constraints: list[dict[str, Any]],
    nodes: list[Any],
    placed: list[tuple[str, dict[str, str]]],
    counts: list[dict[str, int]],
    minimum: list[int],
) -> None:
    state = prefilter(incoming(labels, extra, constraints), nodes, existing(placed))
    assert list(state.counts) == counts
    assert list(state.minimum) == minimum


@pytest.mark.parametrize(
    ("labels", "extra", "constraints", "nodes", "placed", "counts", "minimum"),
    [pytest.param(*c[1:], id=case_id("TestPreFilterState", c[0])) for c in PREFILTER_CASES],
)
def test_prefilter_state_in_the_engine(
    labels: dict[str, str],
    extra: dict[str, Any],
    constraints: list[dict[str, Any]],
    nodes: list[Any],
    placed: list[tuple[str, dict[str, str]]],
    counts: list[dict[str, int]],
    minimum: list[int],
) -> None:
    """The engine's own PreFilter (from its pod index, per inclusion policy) gathers the same counts."""
    probe = incoming(labels, extra, constraints)
    manifests = [
        node(name, labels=node_labels, taints=[TAINT] if tainted else []) for name, node_labels, tainted in nodes
    ]
    e = engine(manifests, existing(placed))
    hard = e.plan(probe).hard_spread  # what the PodTopologySpread filter plugin's PreFilter gathers its state from
    state = podindex.spread_state(probe, e.placed, e.spread_domains(probe, hard), hard)
    assert (list(state.counts), list(state.minimum)) == (counts, minimum)
