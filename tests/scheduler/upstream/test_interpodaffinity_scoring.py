"""kube-scheduler 1.20's InterPodAffinity score tables (`TestPreferredAffinity`,
`TestPreferredAffinityWithHardPodAffinitySymmetricWeight`,
pkg/scheduler/framework/plugins/interpodaffinity/scoring_test.go), held against kubegpu.

Read in a copy of 1.20's scheduler (the plugin's `args`/`sharedLister` fields and `PreScore(ctx, state, pod, nodes)`
of 1.20): github.com/Mr-Linus/Mandalorian at a68905bea7be30dbb1ea041ea13311f36d6c740a. Every row is 1.20's.
Upstream's pods have no namespace (all in one); here all are in `default`. The incoming pod and the existing ones
are labelled `security=S1`/`S2` (or `service=S1`), nodes `region` and `az`.

kubegpu exposes the plugin as `scores.affinity_prescore` (PreScore: per topology pair, the weights of the terms that
match), `scores.affinity_raws` (Score) and `scores.normalize_affinity` (NormalizeScore): the table's numbers are
compared with those. The engine, scoring with InterPodAffinity alone (at the row's `hardPodAffinityWeight`), must
pick one of the nodes the table scores highest.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.scheduler import scores

from ._kube import case_id, engine, node, pod

PREFERRED = "TestPreferredAffinity"
SYMMETRIC = "TestPreferredAffinityWithHardPodAffinitySymmetricWeight"

CHINA, INDIA, AZ1, AZ2 = {"region": "China"}, {"region": "India"}, {"az": "az1"}, {"az": "az2"}
CHINA_AZ1 = {"region": "China", "az": "az1"}
S1, S2, SERVICE_S1 = {"security": "S1"}, {"security": "S2"}, {"service": "S1"}


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def term(key: str, *expressions: dict[str, Any]) -> dict[str, Any]:
    return {"labelSelector": {"matchExpressions": list(expressions)}, "topologyKey": key}


def weighted(weight: int, key: str, *expressions: dict[str, Any]) -> dict[str, Any]:
    return {"weight": weight, "podAffinityTerm": term(key, *expressions)}


def preferred(affinity: list[dict[str, Any]] = (), anti: list[dict[str, Any]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    out: dict[str, Any] = {}
    if affinity:
        out["podAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": list(affinity)}
    if anti:
        out["podAntiAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": list(anti)}
    return out


STAY_WITH_S1_IN_REGION = preferred([weighted(5, "region", expression("security", "In", "S1"))])
STAY_WITH_S2_IN_REGION = preferred([weighted(6, "region", expression("security", "In", "S2"))])
AFFINITY3 = preferred([
    weighted(8, "region", expression("security", "NotIn", "S1"), expression("security", "In", "S2")),
    weighted(2, "region", expression("security", "Exists"), expression("wrongkey", "DoesNotExist")),
])  # fmt: skip
HARD_AFFINITY = {
    "podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            term("region", expression("security", "In", "S1", "value2")),
            term("region", expression("security", "Exists"), expression("wrongkey", "DoesNotExist")),
        ]
    }
}
AWAY_FROM_S1_IN_AZ = preferred(anti=[weighted(5, "az", expression("security", "In", "S1"))])
AWAY_FROM_S2_IN_AZ = preferred(anti=[weighted(5, "az", expression("security", "In", "S2"))])
STAY_WITH_S1_AWAY_FROM_S2 = preferred(
    [weighted(8, "region", expression("security", "In", "S1"))],
    [weighted(5, "az", expression("security", "In", "S2"))],
)
INVALID_AFFINITY = preferred([weighted(8, "region", expression("security", "In", "{{.bad-value.}}"))])
INVALID_ANTI = preferred(anti=[weighted(5, "az", expression("security", "In", "{{.bad-value.}}"))])
HARD_SERVICE = {
    "podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [term("region", expression("service", "In", "S1"))]
    }
}

M = [f"machine{i}" for i in range(6)]  # M[1] is machine1

# (upstream case name, the incoming pod's labels and affinity, existing pods (node, labels, affinity), nodes
#  (name, labels), hardPodAffinityWeight, expected scores; None: PreScore fails, "invalid label value")
Row = tuple[
    str,
    dict[str, str],
    dict[str, Any] | None,
    list[tuple[str, dict[str, str], dict[str, Any] | None]],
    list[tuple[str, dict[str, str]]],
    int,
    dict[str, int] | None,
]
THREE = [(M[1], CHINA), (M[2], INDIA), (M[3], AZ1)]
FIVE = [(M[1], CHINA), (M[2], INDIA), (M[3], CHINA), (M[4], CHINA), (M[5], INDIA)]
CASES: list[Row] = [
    ("all machines are same priority as Affinity is nil", S1, None, [], THREE, 1,
     {M[1]: 0, M[2]: 0, M[3]: 0}),
    ("Affinity: pod that matches topology key & pods in nodes will get high score comparing to otherswhich doesn't "
     "match either pods in nodes or in topology key", S1, STAY_WITH_S1_IN_REGION,
     [(M[1], S1, None), (M[2], S2, None), (M[3], S1, None)], THREE, 1, {M[1]: 100, M[2]: 0, M[3]: 0}),
    ("All the nodes that have the same topology key & label value with one of them has an existing pod that match "
     "the affinity rules, have the same score", {}, STAY_WITH_S1_IN_REGION, [(M[1], S1, None)],
     [(M[1], CHINA), (M[2], CHINA_AZ1), (M[3], INDIA)], 1, {M[1]: 100, M[2]: 100, M[3]: 0}),
    ("Affinity: nodes in one region has more matching pods comparing to other reqion, so the region which has more "
     "macthes will get high score", S1, STAY_WITH_S2_IN_REGION,
     [(M[1], S2, None), (M[1], S2, None), (M[2], S2, None), (M[3], S2, None), (M[4], S2, None), (M[5], S2, None)],
     FIVE, 1, {M[1]: 100, M[2]: 50, M[3]: 100, M[4]: 100, M[5]: 50}),
    ("Affinity: different Label operators and values for pod affinity scheduling preference, including some match "
     "failures ", S1, AFFINITY3, [(M[1], S1, None), (M[2], S2, None), (M[3], S1, None)], THREE, 1,
     {M[1]: 20, M[2]: 100, M[3]: 0}),
    ("Affinity symmetry: considered only the preferredDuringSchedulingIgnoredDuringExecution in pod affinity "
     "symmetry", S2, None, [(M[1], S1, STAY_WITH_S1_IN_REGION), (M[2], S2, STAY_WITH_S2_IN_REGION)], THREE, 1,
     {M[1]: 0, M[2]: 100, M[3]: 0}),
    ("Affinity symmetry: considered RequiredDuringSchedulingIgnoredDuringExecution in pod affinity symmetry", S1,
     None, [(M[1], S1, HARD_AFFINITY), (M[2], S2, HARD_AFFINITY)], THREE, 1, {M[1]: 100, M[2]: 100, M[3]: 0}),
    ("Anti Affinity: pod that doesnot match existing pods in node will get high score ", S1, AWAY_FROM_S1_IN_AZ,
     [(M[1], S1, None), (M[2], S2, None)], [(M[1], AZ1), (M[2], CHINA)], 1, {M[1]: 0, M[2]: 100}),
    ("Anti Affinity: pod that does not matches topology key & matches the pods in nodes will get higher score "
     "comparing to others ", S1, AWAY_FROM_S1_IN_AZ, [(M[1], S1, None), (M[2], S1, None)],
     [(M[1], AZ1), (M[2], CHINA)], 1, {M[1]: 0, M[2]: 100}),
    ("Anti Affinity: one node has more matching pods comparing to other node, so the node which has more unmacthes "
     "will get high score", S1, AWAY_FROM_S1_IN_AZ, [(M[1], S1, None), (M[1], S1, None), (M[2], S2, None)],
     [(M[1], AZ1), (M[2], INDIA)], 1, {M[1]: 0, M[2]: 100}),
    ("Anti Affinity symmetry: the existing pods in node which has anti affinity match will get high score", S2, None,
     [(M[1], S1, AWAY_FROM_S2_IN_AZ), (M[2], S2, AWAY_FROM_S1_IN_AZ)], [(M[1], AZ1), (M[2], AZ2)], 1,
     {M[1]: 0, M[2]: 100}),
    ("Affinity and Anti Affinity: considered only preferredDuringSchedulingIgnoredDuringExecution in both pod "
     "affinity & anti affinity", S1, STAY_WITH_S1_AWAY_FROM_S2, [(M[1], S1, None), (M[2], S1, None)],
     [(M[1], CHINA), (M[2], AZ1)], 1, {M[1]: 100, M[2]: 0}),
    ("Affinity and Anti Affinity: considering both affinity and anti-affinity, the pod to schedule and existing pods "
     "have the same labels", S1, STAY_WITH_S1_AWAY_FROM_S2,
     [(M[1], S1, None), (M[1], S1, None), (M[2], S1, None), (M[3], S1, None), (M[3], S1, None), (M[4], S1, None),
      (M[5], S1, None)],
     [(M[1], CHINA_AZ1), (M[2], INDIA), (M[3], CHINA), (M[4], CHINA), (M[5], INDIA)], 1,
     {M[1]: 100, M[2]: 40, M[3]: 100, M[4]: 100, M[5]: 40}),
    ("Affinity and Anti Affinity and symmetry: considered only preferredDuringSchedulingIgnoredDuringExecution in "
     "both pod affinity & anti affinity & symmetry", S1, STAY_WITH_S1_AWAY_FROM_S2,
     [(M[1], S1, None), (M[2], S2, None), (M[3], {}, STAY_WITH_S1_AWAY_FROM_S2), (M[4], {}, AWAY_FROM_S1_IN_AZ)],
     [(M[1], CHINA), (M[2], AZ1), (M[3], INDIA), (M[4], AZ2)], 1, {M[1]: 100, M[2]: 0, M[3]: 100, M[4]: 0}),
    ("Avoid panic when partial nodes in a topology don't have pods with affinity", S1, None,
     [(M[1], S1, None), (M[2], {}, STAY_WITH_S1_AWAY_FROM_S2)], [(M[1], CHINA), (M[2], CHINA)], 1,
     {M[1]: 100, M[2]: 100}),
    ("invalid Affinity fails PreScore", {}, INVALID_AFFINITY, [], [(M[1], CHINA), (M[2], CHINA)], 1, None),
    ("invalid AntiAffinity fails PreScore", {}, INVALID_ANTI, [], [(M[1], CHINA), (M[2], CHINA)], 1, None),
]  # fmt: skip
SYMMETRIC_CASES: list[Row] = [
    ("Hard Pod Affinity symmetry: hard pod affinity symmetry weights 1 by default, then nodes that match the hard "
     "pod affinity symmetry rules, get a high score", SERVICE_S1, None,
     [(M[1], {}, HARD_SERVICE), (M[2], {}, HARD_SERVICE)], THREE, 1, {M[1]: 100, M[2]: 100, M[3]: 0}),
    ("Hard Pod Affinity symmetry: hard pod affinity symmetry is closed(weights 0), then nodes that match the hard "
     "pod affinity symmetry rules, get same score with those not match", SERVICE_S1, None,
     [(M[1], {}, HARD_SERVICE), (M[2], {}, HARD_SERVICE)], THREE, 0, {M[1]: 0, M[2]: 0, M[3]: 0}),
]  # fmt: skip
NOT_EXPRESSIBLE: dict[str, str] = {}

INVALID = (
    "1.20 fails PreScore with an error for a term whose selector holds an invalid label value, and never schedules "
    "the pod; kubegpu reads the term as selecting nothing (no pod carries such a value) and scores every node alike"
)
XFAIL = {"invalid Affinity fails PreScore": INVALID, "invalid AntiAffinity fails PreScore": INVALID}


def incoming(labels: dict[str, str], affinity: dict[str, Any] | None) -> Any:
    return pod("p", {"affinity": affinity} if affinity else {}, labels=labels)


def existing(rows: list[tuple[str, dict[str, str], dict[str, Any] | None]]) -> list[tuple[Any, str]]:
    out = []
    for i, (where, labels, affinity) in enumerate(rows):
        spec: dict[str, Any] = {"nodeName": where}
        if affinity:
            spec["affinity"] = affinity
        out.append((pod(f"p-{i}", spec, labels=labels), where))
    return out


def plugin_scores(
    probe: Any, nodes: list[tuple[str, dict[str, str]]], pods: list[tuple[Any, str]], hard: int
) -> dict[str, int]:
    labels = dict(nodes)
    state = scores.affinity_prescore(probe, [(p, labels[where]) for p, where in pods], hard)
    normalized = scores.normalize_affinity(scores.affinity_raws(state, [node_labels for _, node_labels in nodes]))
    return {name: score for (name, _), score in zip(nodes, normalized, strict=True)}


def params(test: str, cases: list[Row]) -> list[Any]:
    return [
        pytest.param(
            *c[1:],
            id=case_id(test, c[0]) + (" [xfail: 1.20 refuses an invalid label value]" if c[0] in XFAIL else ""),
            marks=[pytest.mark.xfail(strict=True, reason=XFAIL[c[0]])] if c[0] in XFAIL else [],
        )
        for c in cases
    ]


ARGS = ("labels", "affinity", "placed", "nodes", "hard", "expected")
PARAMS = params(PREFERRED, CASES) + params(SYMMETRIC, SYMMETRIC_CASES)


@pytest.mark.parametrize(ARGS, PARAMS)
def test_preferred_affinity(
    labels: dict[str, str],
    affinity: dict[str, Any] | None,
    placed: list[tuple[str, dict[str, str], dict[str, Any] | None]],
    nodes: list[tuple[str, dict[str, str]]],
    hard: int,
    expected: dict[str, int] | None,
) -> None:
    got = plugin_scores(incoming(labels, affinity), nodes, existing(placed), hard)
    assert expected is not None, f"1.20 refuses the pod (invalid label value); kubegpu scores it: {got}"
    assert got == expected


@pytest.mark.parametrize(ARGS, PARAMS)
def test_preferred_affinity_in_the_engine(
    labels: dict[str, str],
    affinity: dict[str, Any] | None,
    placed: list[tuple[str, dict[str, str], dict[str, Any] | None]],
    nodes: list[tuple[str, dict[str, str]]],
    hard: int,
    expected: dict[str, int] | None,
) -> None:
    profile = scores.Profile({scores.INTER_POD_AFFINITY: 1}, hard_pod_affinity_weight=hard)
    e = engine([node(name, labels=node_labels) for name, node_labels in nodes], existing(placed), profile=profile)
    decision = e.decide(incoming(labels, affinity))
    if expected is None:
        assert not decision.scheduled and "invalid label value" in (decision.reason or "")
        return
    best = max(expected.values())
    assert decision.node in {name for name, score in expected.items() if score == best}
