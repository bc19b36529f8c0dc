"""kube-scheduler 1.20's NodeUnschedulable filter table (`TestNodeUnschedulable`,
pkg/scheduler/framework/plugins/nodeunschedulable/node_unschedulable_test.go), held against kubegpu's engine.

Read at kubernetes/kubernetes commit 00a12c787cb55fa704576e899983e62d2a3d2dc6 (the stored copy; its three cases are
the three 1.20 has). A cordoned node refuses a pod as UnschedulableAndUnresolvable with "node(s) were unschedulable"
unless the pod tolerates the `node.kubernetes.io/unschedulable:NoSchedule` taint.
"""

from __future__ import annotations

from typing import Any

import pytest

from ._kube import case_id, engine, node, pod, verdict

TEST = "TestNodeUnschedulable"
UNSCHEDULABLE = ("UnschedulableAndUnresolvable", ("node(s) were unschedulable",))
FITS = ("Success", ())

# (upstream case name, pod spec, node.spec.unschedulable, expected verdict)
CASES: list[tuple[str, dict[str, Any], bool, tuple[str, tuple[str, ...]]]] = [
    ("Does not schedule pod to unschedulable node (node.Spec.Unschedulable==true)", {}, True, UNSCHEDULABLE),
    ("Schedule pod to normal node", {}, False, FITS),
    (
        "Schedule pod with toleration to unschedulable node (node.Spec.Unschedulable==true)",
        {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
        True,
        FITS,
    ),
]

NOT_EXPRESSIBLE: dict[str, str] = {}


@pytest.mark.parametrize(("case", "spec", "cordoned", "expected"), CASES, ids=[case_id(TEST, c[0]) for c in CASES])
def test_node_unschedulable(case: str, spec: dict[str, Any], cordoned: bool, expected: object) -> None:
    e = engine([node("n", unschedulable=cordoned)])
    assert verdict(e.filter_node("n", pod("p", spec))) == expected
