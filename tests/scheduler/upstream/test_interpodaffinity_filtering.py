"""kube-scheduler 1.20's InterPodAffinity filter table (`TestRequiredAffinitySingleNode`,
pkg/scheduler/framework/plugins/interpodaffinity/filtering_test.go), held against kubegpu's engine.

Read at kubernetes/kubernetes commit 007f7ae7dc217d27dad994dce003cfe1c5bc6706 (the framework still in `v1alpha1`, a
copy from just before 1.20 whose rows 1.20 keeps, with the same reasons and codes); its first 14 rows are transcribed.
One node, machine1, labelled region=r1 and zone=z11; the incoming pod is labelled `security=S1` or
`service=securityscan` as upstream's `podLabel2` or `podLabel`. Upstream's pods with an empty namespace are in
`default` here (a term without namespaces means the pod's own either way). An existing pod bound to a node the
snapshot lacks (machine2) counts nowhere, so it is left out of the engine.
"""

from __future__ import annotations

from typing import Any

import pytest

from ._kube import case_id, engine, node, pod, verdict

TEST = "TestRequiredAffinitySingleNode"
SECURITY = {"security": "S1"}
SERVICE = {"service": "securityscan"}
FITS = ("Success", ())
AFFINITY = "node(s) didn't match pod affinity/anti-affinity"
NO_AFFINITY = ("UnschedulableAndUnresolvable", (AFFINITY, "node(s) didn't match pod affinity rules"))
NO_ANTI = ("Unschedulable", (AFFINITY, "node(s) didn't match pod anti-affinity rules"))
EXISTING_ANTI = ("Unschedulable", (AFFINITY, "node(s) didn't satisfy existing pods anti-affinity rules"))


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)} if values else {"key": key, "operator": operator}


def term(*exprs: dict[str, Any], key: str | None = None, namespaces: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"labelSelector": {"matchExpressions": list(exprs)}}
    if key is not None:
        out["topologyKey"] = key
    if namespaces is not None:
        out["namespaces"] = namespaces
    return out


def affinity(required: list[dict[str, Any]] | None = None, anti: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if required:
        out["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": required}
    if anti:
        out["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": anti}
    return {"affinity": out} if out else {}


SCAN_IN_REGION = term(expr("service", "In", "securityscan", "value2"), key="region")
ANTIVIRUS_ON_NODE = term(expr("service", "In", "antivirusscan", "value2"), key="node")

# (upstream case name, incoming pod (labels, spec), existing pods on machine1 (namespace, labels, spec), verdict)
Existing = list[tuple[str, dict[str, str], dict[str, Any]]]
CASES: list[tuple[str, tuple[dict[str, str], dict[str, Any]], Existing, tuple[str, tuple[str, ...]]]] = [
    (
        "A pod that has no required pod affinity scheduling rules can schedule onto a node with no existing pods",
        ({}, {}),
        [],
        FITS,
    ),
    (
        "satisfies with requiredDuringSchedulingIgnoredDuringExecution in PodAffinity using In operator that matches "
        "the existing pod",
        (SECURITY, affinity([SCAN_IN_REGION])),
        [("default", SERVICE, {})],
        FITS,
    ),
    (
        "satisfies the pod with requiredDuringSchedulingIgnoredDuringExecution in PodAffinity using not in operator "
        "in labelSelector that matches the existing pod",
        (SECURITY, affinity([term(expr("service", "NotIn", "securityscan3", "value3"), key="region")])),
        [("default", SERVICE, {})],
        FITS,
    ),
    (
        "satisfies the PodAffinity with different label Operators in multiple RequiredDuringSchedulingIgnoredDuring"
        "Execution ",
        (
            SECURITY,
            affinity(
                [
                    term(expr("service", "Exists"), expr("wrongkey", "DoesNotExist"), key="region"),
                    term(expr("service", "In", "securityscan"), expr("service", "NotIn", "WrongValue"), key="region"),
                ]
            ),
        ),
        [("default", SERVICE, {})],
        FITS,
    ),
    (
        "The labelSelector requirements(items of matchExpressions) are ANDed, the pod cannot schedule onto the node "
        "because one of the matchExpression item don't match.",
        (
            SECURITY,
            affinity(
                [
                    term(expr("service", "Exists"), expr("wrongkey", "DoesNotExist"), key="region"),
                    term(expr("service", "In", "securityscan2"), expr("service", "NotIn", "WrongValue"), key="region"),
                ]
            ),
        ),
        [("default", SERVICE, {})],
        NO_AFFINITY,
    ),
    (
        "satisfies the PodAffinity and PodAntiAffinity with the existing pod",
        (SECURITY, affinity([SCAN_IN_REGION], [ANTIVIRUS_ON_NODE])),
        [("default", SERVICE, {})],
        FITS,
    ),
    (
        "satisfies the PodAffinity and PodAntiAffinity and PodAntiAffinity symmetry with the existing pod",
        (SECURITY, affinity([SCAN_IN_REGION], [ANTIVIRUS_ON_NODE])),
        [("default", SERVICE, affinity(None, [ANTIVIRUS_ON_NODE]))],
        FITS,
    ),
    (
        "satisfies the PodAffinity but doesn't satisfy the PodAntiAffinity with the existing pod",
        (SECURITY, affinity([SCAN_IN_REGION], [term(expr("service", "In", "securityscan", "value2"), key="zone")])),
        [("default", SERVICE, {})],
        NO_ANTI,
    ),
    (
        "satisfies the PodAffinity and PodAntiAffinity but doesn't satisfy PodAntiAffinity symmetry with the "
        "existing pod",
        (SERVICE, affinity([SCAN_IN_REGION], [ANTIVIRUS_ON_NODE])),
        [
            (
                "default",
                SERVICE,
                affinity(None, [term(expr("service", "In", "securityscan", "value2"), key="zone")]),
            )
        ],
        EXISTING_ANTI,
    ),
    (
        "pod matches its own Label in PodAffinity and that matches the existing pod Labels",
        (SERVICE, affinity([term(expr("service", "NotIn", "securityscan", "value2"), key="region")])),
        [],  # upstream's one existing pod is bound to machine2, which the snapshot lacks
        NO_AFFINITY,
    ),
    (
        "verify that PodAntiAffinity from existing pod is respected when pod has no AntiAffinity constraints. "
        "doesn't satisfy PodAntiAffinity symmetry with the existing pod",
        (SERVICE, {}),
        [
            (
                "default",
                SERVICE,
                affinity(None, [term(expr("service", "In", "securityscan", "value2"), key="zone")]),
            )
        ],
        EXISTING_ANTI,
    ),
    (
        "verify that PodAntiAffinity from existing pod is respected when pod has no AntiAffinity constraints. "
        "satisfy PodAntiAffinity symmetry with the existing pod",
        (SERVICE, {}),
        [
            (
                "default",
                SERVICE,
                affinity(None, [term(expr("service", "NotIn", "securityscan", "value2"), key="zone")]),
            )
        ],
        FITS,
    ),
]

NO_TOPOLOGY_KEY = (
    "its affinity term has no topologyKey, which the API server rejects for required terms; kubegpu's manifest "
    "parser rejects the pod as the API server would, so the filter never sees it"
)
NOT_EXPRESSIBLE: dict[str, str] = {
    "Does not satisfy the PodAffinity with labelSelector because of diff Namespace": NO_TOPOLOGY_KEY,
    "Doesn't satisfy the PodAffinity because of unmatching labelSelector with the existing pod": NO_TOPOLOGY_KEY,
}

# A refusal by the pod's own affinity terms is UnschedulableAndUnresolvable, as in kube-scheduler; such a plan never
# settles a node class (`Plan.settles`).
XFAIL: dict[str, str] = {}


@pytest.mark.parametrize(
    ("incoming", "placed", "expected"),
    [
        pytest.param(
            *c[1:],
            id=case_id(TEST, c[0]),
            marks=[pytest.mark.xfail(strict=True, reason=XFAIL[c[0]])] if c[0] in XFAIL else [],
        )
        for c in CASES
    ],
)
def test_required_affinity_single_node(
    incoming: tuple[dict[str, str], dict[str, Any]], placed: Existing, expected: object
) -> None:
    existing = [
        (pod(f"existing-{i}", {**spec, "nodeName": "machine1"}, namespace=ns, labels=labels), "machine1")
        for i, (ns, labels, spec) in enumerate(placed)
    ]
    e = engine([node("machine1", labels={"region": "r1", "zone": "z11"})], existing)
    labels, spec = incoming
    assert verdict(e.filter_node("machine1", pod("p", spec, labels=labels))) == expected
