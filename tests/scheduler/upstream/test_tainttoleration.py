"""kube-scheduler 1.20's TaintToleration tables (`TestTaintTolerationFilter`, `TestTaintTolerationScore`,
pkg/scheduler/framework/plugins/tainttoleration/taint_toleration_test.go), held against kubegpu.

Read at kubernetes/kubernetes commit 04c0d74f8e8bf18e93a9d8d082b218d3eb4c6395, a later copy than 1.20: its cases
with `Gt`/`Lt` tolerations (TaintTolerationComparisonOperators, added long after 1.20) are not 1.20's and are left
out; the others are 1.20's cases, with 1.20's reason ("node(s) had taint {key: value}, that the pod didn't
tolerate"; the copy read words it "node(s) had untolerated taint(s)", as releases after 1.25 do).

Scores: upstream compares the plugin's normalized scores (0..100). kubegpu exposes the rule as `scores.taint_raw`
(the untolerated `PreferNoSchedule` taints) and `scores.normalize_default(reverse=True)`, which the engine applies
per plugin; the table's numbers are compared with those, and the engine, scoring with TaintToleration alone, must
pick a node the table scores highest.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.models import Taint
from kubegpu.scheduler import scores

from ._kube import case_id, engine, node, pod, verdict

FILTER = "TestTaintTolerationFilter"
SCORE = "TestTaintTolerationScore"
FITS = ("Success", ())


def refused(key: str, value: str) -> tuple[str, tuple[str, ...]]:
    return ("UnschedulableAndUnresolvable", (f"node(s) had taint {{{key}: {value}}}, that the pod didn't tolerate",))


def taint(key: str, value: str, effect: str) -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect}


def toleration(key: str, value: str | None = None, effect: str | None = None, operator: str | None = None) -> dict:  # type: ignore[type-arg]
    fields = {"key": key, "operator": operator, "value": value, "effect": effect}
    return {k: v for k, v in fields.items() if v is not None}


# (upstream case name, pod tolerations, node taints, expected verdict)
FILTER_CASES: list[tuple[str, list[dict[str, str]], list[dict[str, str]], tuple[str, tuple[str, ...]]]] = [
    (
        "A pod having no tolerations can't be scheduled onto a node with nonempty taints",
        [],
        [taint("dedicated", "user1", "NoSchedule")],
        refused("dedicated", "user1"),
    ),
    (
        "A pod which can be scheduled on a dedicated node assigned to user1 with effect NoSchedule",
        [toleration("dedicated", "user1", "NoSchedule")],
        [taint("dedicated", "user1", "NoSchedule")],
        FITS,
    ),
    (
        "A pod which can't be scheduled on a dedicated node assigned to user2 with effect NoSchedule",
        [toleration("dedicated", "user2", "NoSchedule", "Equal")],
        [taint("dedicated", "user1", "NoSchedule")],
        refused("dedicated", "user1"),
    ),
    (
        "A pod can be scheduled onto the node, with a toleration uses operator Exists that tolerates the taints on "
        "the node",
        [toleration("foo", None, "NoSchedule", "Exists")],
        [taint("foo", "bar", "NoSchedule")],
        FITS,
    ),
    (
        "A pod has multiple tolerations, node has multiple taints, all the taints are tolerated, pod can be "
        "scheduled onto the node",
        [toleration("dedicated", "user2", "NoSchedule", "Equal"), toleration("foo", None, "NoSchedule", "Exists")],
        [taint("dedicated", "user2", "NoSchedule"), taint("foo", "bar", "NoSchedule")],
        FITS,
    ),
    (
        "A pod has a toleration that keys and values match the taint on the node, but (non-empty) effect doesn't "
        "match, can't be scheduled onto the node",
        [toleration("foo", "bar", "PreferNoSchedule", "Equal")],
        [taint("foo", "bar", "NoSchedule")],
        refused("foo", "bar"),
    ),
    (
        "The pod has a toleration that keys and values match the taint on the node, the effect of toleration is "
        "empty, and the effect of taint is NoSchedule. Pod can be scheduled onto the node",
        [toleration("foo", "bar", None, "Equal")],
        [taint("foo", "bar", "NoSchedule")],
        FITS,
    ),
    (
        "The pod has a toleration that key and value don't match the taint on the node, but the effect of taint on "
        "node is PreferNoSchedule. Pod can be scheduled onto the node",
        [toleration("dedicated", "user2", "NoSchedule", "Equal")],
        [taint("dedicated", "user1", "PreferNoSchedule")],
        FITS,
    ),
    (
        "The pod has no toleration, but the effect of taint on node is PreferNoSchedule. Pod can be scheduled onto "
        "the node",
        [],
        [taint("dedicated", "user1", "PreferNoSchedule")],
        FITS,
    ),
]

# (upstream case name, pod tolerations, {node: taints}, expected normalized score per node)
SCORE_CASES: list[tuple[str, list[dict[str, str]], dict[str, list[dict[str, str]]], dict[str, int]]] = [
    (
        "node with taints tolerated by the pod, gets a higher score than those node with intolerable taints",
        [toleration("foo", "bar", "PreferNoSchedule", "Equal")],
        {"nodeA": [taint("foo", "bar", "PreferNoSchedule")], "nodeB": [taint("foo", "blah", "PreferNoSchedule")]},
        {"nodeA": 100, "nodeB": 0},
    ),
    (
        "the nodes that all of their taints are tolerated by the pod, get the same score, no matter how many "
        "tolerable taints a node has",
        [
            toleration("cpu-type", "arm64", "PreferNoSchedule", "Equal"),
            toleration("disk-type", "ssd", "PreferNoSchedule", "Equal"),
        ],
        {
            "nodeA": [],
            "nodeB": [taint("cpu-type", "arm64", "PreferNoSchedule")],
            "nodeC": [taint("cpu-type", "arm64", "PreferNoSchedule"), taint("disk-type", "ssd", "PreferNoSchedule")],
        },
        {"nodeA": 100, "nodeB": 100, "nodeC": 100},
    ),
    (
        "the more intolerable taints a node has, the lower score it gets.",
        [toleration("foo", "bar", "PreferNoSchedule", "Equal")],
        {
            "nodeA": [],
            "nodeB": [taint("cpu-type", "arm64", "PreferNoSchedule")],
            "nodeC": [taint("cpu-type", "arm64", "PreferNoSchedule"), taint("disk-type", "ssd", "PreferNoSchedule")],
        },
        {"nodeA": 100, "nodeB": 50, "nodeC": 0},
    ),
    (
        "only taints and tolerations that have effect PreferNoSchedule are checked by taints-tolerations priority "
        "function",
        [
            toleration("cpu-type", "arm64", "NoSchedule", "Equal"),
            toleration("disk-type", "ssd", "NoSchedule", "Equal"),
        ],
        {
            "nodeA": [],
            "nodeB": [taint("cpu-type", "arm64", "NoSchedule")],
            "nodeC": [taint("cpu-type", "arm64", "PreferNoSchedule"), taint("disk-type", "ssd", "PreferNoSchedule")],
        },
        {"nodeA": 100, "nodeB": 100, "nodeC": 0},
    ),
    (
        "Default behaviour No taints and tolerations, lands on node with no taints",
        [],
        {"nodeA": [], "nodeB": [taint("cpu-type", "arm64", "PreferNoSchedule")]},
        {"nodeA": 100, "nodeB": 0},
    ),
]

NOT_EXPRESSIBLE: dict[str, str] = {}


@pytest.mark.parametrize(
    ("tolerations", "taints", "expected"),
    [pytest.param(*c[1:], id=case_id(FILTER, c[0])) for c in FILTER_CASES],
)
def test_taint_toleration_filter(tolerations: list[Any], taints: list[dict[str, str]], expected: object) -> None:
    e = engine([node("nodeA", taints=taints)])
    assert verdict(e.filter_node("nodeA", pod("pod1", {"tolerations": tolerations}))) == expected


@pytest.mark.parametrize(
    ("tolerations", "nodes", "expected"),
    [pytest.param(*c[1:], id=case_id(SCORE, c[0])) for c in SCORE_CASES],
)
def test_taint_toleration_score(
    tolerations: list[Any], nodes: dict[str, list[dict[str, str]]], expected: dict[str, int]
) -> None:
    incoming = pod("pod1", {"tolerations": tolerations})
    raw = [
        scores.taint_raw(incoming, [Taint(t["key"], t["value"], t["effect"]) for t in taints])
        for taints in nodes.values()
    ]
    assert dict(zip(nodes, scores.normalize_default(raw, reverse=True), strict=True)) == expected
    e = engine(
        [node(name, taints=taints) for name, taints in nodes.items()], profile=scores.Profile({scores.TAINTS: 1})
    )
    assert expected[e.schedule(incoming).node or ""] == max(expected.values())
