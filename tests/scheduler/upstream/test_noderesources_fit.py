"""kube-scheduler 1.20's NodeResourcesFit table (`TestEnoughRequests`,
pkg/scheduler/framework/plugins/noderesources/fit_test.go), held against kubegpu's engine.

Read at kubernetes/kubernetes commit 007f7ae7dc217d27dad994dce003cfe1c5bc6706 (the framework still in `v1alpha1`, a
copy from just before 1.20 whose `TestEnoughRequests` rows 1.20 keeps). Transcribed: the cpu, memory, init-container
and extended-resource rows read; each node is upstream's `makeResources(10, 20, 32, 5, 20, 5)` (10 millicores, 20
bytes, 32 pods, 5 `example.com/aaa`) holding one pod with the listed usage. A request is (millicores, bytes,
{extended resource: count}).
"""

from __future__ import annotations

from typing import Any

import pytest

from ._kube import case_id, container, engine, node, pod, verdict

TEST = "TestEnoughRequests"
EXT_A = "example.com/aaa"
EXT_B = "example.com/bbb"
FITS = ("Success", ())

Usage = tuple[int, int, dict[str, int]]


def usage(cpu: int = 0, memory: int = 0, **extended: int) -> Usage:
    return cpu, memory, {EXT_A if k == "a" else EXT_B: v for k, v in extended.items()}


def insufficient(*resources: str) -> tuple[str, tuple[str, ...]]:
    return ("Unschedulable", tuple(f"Insufficient {r}" for r in resources))


# (upstream case name, containers, init containers, the existing pod's containers, expected verdict)
CASES: list[tuple[str, list[Usage], list[Usage], list[Usage], tuple[str, tuple[str, ...]]]] = [
    ("no resources requested always fits", [], [], [usage(10, 20)], FITS),
    ("too many resources fails", [usage(1, 1)], [], [usage(10, 20)], insufficient("cpu", "memory")),
    (
        "too many resources fails due to init container cpu",
        [usage(1, 1)],
        [usage(3, 1)],
        [usage(8, 19)],
        insufficient("cpu"),
    ),
    (
        "too many resources fails due to highest init container cpu",
        [usage(1, 1)],
        [usage(3, 1), usage(2, 1)],
        [usage(8, 19)],
        insufficient("cpu"),
    ),
    (
        "too many resources fails due to init container memory",
        [usage(1, 1)],
        [usage(1, 3)],
        [usage(9, 19)],
        insufficient("memory"),
    ),
    (
        "too many resources fails due to highest init container memory",
        [usage(1, 1)],
        [usage(1, 3), usage(1, 2)],
        [usage(9, 19)],
        insufficient("memory"),
    ),
    (
        "init container fits because it's the max, not sum, of containers and init containers",
        [usage(1, 1)],
        [usage(1, 1)],
        [usage(9, 19)],
        FITS,
    ),
    (
        "multiple init containers fit because it's the max, not sum, of containers and init containers",
        [usage(1, 1)],
        [usage(1, 1), usage(1, 1)],
        [usage(9, 19)],
        FITS,
    ),
    ("both resources fit", [usage(1, 1)], [], [usage(5, 5)], FITS),
    ("one resource memory fits", [usage(2, 1)], [], [usage(9, 5)], insufficient("cpu")),
    ("one resource cpu fits", [usage(1, 2)], [], [usage(5, 19)], insufficient("memory")),
    ("equal edge case", [usage(5, 1)], [], [usage(5, 19)], FITS),
    ("equal edge case for init container", [usage(4, 1)], [usage(5, 1)], [usage(5, 19)], FITS),
    ("extended resource fits", [usage(a=1)], [], [usage()], FITS),
    ("extended resource fits for init container", [usage()], [usage(a=1)], [usage()], FITS),
    ("extended resource capacity enforced", [usage(1, 1, a=10)], [], [usage(a=0)], insufficient(EXT_A)),
    (
        "extended resource capacity enforced for init container",
        [usage()],
        [usage(1, 1, a=10)],
        [usage(a=0)],
        insufficient(EXT_A),
    ),
    ("extended resource allocatable enforced", [usage(1, 1, a=1)], [], [usage(a=5)], insufficient(EXT_A)),
    (
        "extended resource allocatable enforced for init container",
        [usage()],
        [usage(1, 1, a=1)],
        [usage(a=5)],
        insufficient(EXT_A),
    ),
    (
        "extended resource allocatable enforced for multiple containers",
        [usage(1, 1, a=3), usage(1, 1, a=3)],
        [],
        [usage(a=2)],
        insufficient(EXT_A),
    ),
    (
        "extended resource allocatable admits multiple init containers",
        [usage()],
        [usage(1, 1, a=3), usage(1, 1, a=3)],
        [usage(a=2)],
        FITS,
    ),
    (
        "extended resource allocatable enforced for multiple init containers",
        [usage()],
        [usage(1, 1, a=6), usage(1, 1, a=3)],
        [usage(a=2)],
        insufficient(EXT_A),
    ),
    (
        "extended resource allocatable enforced for unknown resource",
        [usage(1, 1, b=1)],
        [],
        [usage()],
        insufficient(EXT_B),
    ),
]

# kubegpu answers a request larger than the node's whole allocatable (when it is the only shortfall) as
# UnschedulableAndUnresolvable, so preemption leaves the node alone (`Engine._usage_fit`); kube-scheduler 1.20 says
# Unschedulable for every shortfall.
HOPELESS = (
    "kubegpu answers UnschedulableAndUnresolvable when the request exceeds the node's allocatable outright "
    "(Engine._usage_fit); kube-scheduler 1.20 answers Unschedulable"
)
XFAIL: dict[str, str] = {
    "extended resource capacity enforced": HOPELESS,
    "extended resource capacity enforced for init container": HOPELESS,
    "extended resource allocatable enforced for multiple containers": HOPELESS,
    "extended resource allocatable enforced for multiple init containers": HOPELESS,
    "extended resource allocatable enforced for unknown resource": HOPELESS,
}

NOT_EXPRESSIBLE: dict[str, str] = {}


def containers(prefix: str, usages: list[Usage]) -> list[dict[str, Any]]:
    out = []
    for i, (cpu, memory, extended) in enumerate(usages):
        requests = {"cpu": f"{cpu}m", "memory": str(memory), **{k: str(v) for k, v in extended.items()}}
        out.append(container(f"{prefix}{i}", requests=requests))
    return out


def spec(regular: list[Usage], init: list[Usage]) -> dict[str, Any]:
    # upstream's pod without containers asks for nothing: one container asking for 0 of each is the same request
    out: dict[str, Any] = {"containers": containers("c", regular) or containers("c", [usage()])}
    if init:
        out["initContainers"] = containers("init", init)
    return out


@pytest.mark.parametrize(
    ("regular", "init", "existing", "expected"),
    [
        pytest.param(
            *c[1:],
            id=case_id(TEST, c[0]),
            marks=[pytest.mark.xfail(strict=True, reason=XFAIL[c[0]])] if c[0] in XFAIL else [],
        )
        for c in CASES
    ],
)
def test_enough_requests(regular: list[Usage], init: list[Usage], existing: list[Usage], expected: object) -> None:
    manifest = node("machine1", cpu="10m", memory="20", allocatable={"pods": "32", EXT_A: "5"})
    e = engine([manifest], [(pod("existing", spec(existing, [])), "machine1")])
    assert verdict(e.filter_node("machine1", pod("incoming", spec(regular, init)))) == expected
