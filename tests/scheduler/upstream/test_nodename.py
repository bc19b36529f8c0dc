"""kube-scheduler 1.20's NodeName filter table (`TestNodeName`,
pkg/scheduler/framework/plugins/nodename/node_name_test.go), held against kubegpu's engine.

Read at kubernetes/kubernetes commit 054d429d9f8bc8de4fc82e6cf2281e12a13fe1f2 (the 1.20 layout: the framework in
`pkg/scheduler/framework`, `New(nil, nil)`). kubegpu lists NodeName among the filters it has nothing to do for (a pod
with `spec.nodeName` is already bound; `kubegpu.scheduler.scores.UNSUPPORTED_FILTERS`), so the table is asked of
`Engine.filter_node`, the answer an extender's filter gives for such a pod.
"""

from __future__ import annotations

import pytest

from ._kube import case_id, engine, node, pod, verdict

TEST = "TestNodeName"
FITS = ("Success", ())
MISMATCH = ("UnschedulableAndUnresolvable", ("node(s) didn't match the requested hostname",))

# (upstream case name, pod spec.nodeName, node name, expected verdict, xfail reason)
CASES: list[tuple[str, str | None, str, tuple[str, tuple[str, ...]], str | None]] = [
    ("no host specified", None, "foo", FITS, None),
    ("host matches", "foo", "foo", FITS, None),
    (
        "host doesn't match",
        "bar",
        "foo",
        MISMATCH,
        "kubegpu runs no NodeName filter: filter_node passes a node other than the pod's spec.nodeName",
    ),
]

NOT_EXPRESSIBLE: dict[str, str] = {}


@pytest.mark.parametrize(
    ("wanted", "name", "expected"),
    [
        pytest.param(w, n, x, id=case_id(TEST, c), marks=[pytest.mark.xfail(strict=True, reason=r)] if r else [])
        for c, w, n, x, r in CASES
    ],
)
def test_node_name(wanted: str | None, name: str, expected: object) -> None:
    e = engine([node(name)])
    assert verdict(e.filter_node(name, pod("p", {"nodeName": wanted} if wanted else {}))) == expected
