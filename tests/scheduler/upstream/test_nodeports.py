"""kube-scheduler 1.20's NodePorts filter table (`TestNodePorts`,
pkg/scheduler/framework/plugins/nodeports/node_ports_test.go), held against kubegpu's engine.

Read at kubernetes/kubernetes commit 008b3652959ca58af8be3fb5b6ecfe9ae7638282, a later copy than 1.20. Its first case
("skip filter": a pod without host ports, which 1.20 names "nothing running") is 1.20's with PreFilter's Skip added;
kubegpu answers it as 1.20 did, the node fits. The copy's init-container cases (restartable "sidecar" init
containers, a 1.28 feature) and its `TestFits` table (added after 1.20) are not 1.20's and are left out. Each port is
written as upstream writes it, `protocol/hostIP/hostPort`; the node holds one pod with the existing ports.
"""

from __future__ import annotations

import pytest

from ._kube import case_id, container, engine, node, pod, verdict

TEST = "TestNodePorts"
FITS = ("Success", ())
CONFLICT = ("Unschedulable", ("node(s) didn't have free ports for the requested pod ports",))

# (upstream case name, the incoming pod's ports, the existing pod's ports, expected verdict)
CASES: list[tuple[str, list[str], list[str], tuple[str, tuple[str, ...]]]] = [
    ("skip filter", [], [], FITS),
    ("other port", ["UDP/127.0.0.1/8080"], ["UDP/127.0.0.1/9090"], FITS),
    ("same udp port", ["UDP/127.0.0.1/8080"], ["UDP/127.0.0.1/8080"], CONFLICT),
    ("same tcp port", ["TCP/127.0.0.1/8080"], ["TCP/127.0.0.1/8080"], CONFLICT),
    ("different host ip", ["TCP/127.0.0.1/8080"], ["TCP/127.0.0.2/8080"], FITS),
    ("different protocol", ["UDP/127.0.0.1/8080"], ["TCP/127.0.0.1/8080"], FITS),
    ("second udp port conflict", ["UDP/127.0.0.1/8000", "UDP/127.0.0.1/8080"], ["UDP/127.0.0.1/8080"], CONFLICT),
    (
        "first tcp port conflict",
        ["TCP/127.0.0.1/8001", "UDP/127.0.0.1/8080"],
        ["TCP/127.0.0.1/8001", "UDP/127.0.0.1/8081"],
        CONFLICT,
    ),
    ("first tcp port conflict due to 0.0.0.0 hostIP", ["TCP/0.0.0.0/8001"], ["TCP/127.0.0.1/8001"], CONFLICT),
    (
        "TCP hostPort conflict due to 0.0.0.0 hostIP",
        ["TCP/10.0.10.10/8001", "TCP/0.0.0.0/8001"],
        ["TCP/127.0.0.1/8001"],
        CONFLICT,
    ),
    ("second tcp port conflict to 0.0.0.0 hostIP", ["TCP/127.0.0.1/8001"], ["TCP/0.0.0.0/8001"], CONFLICT),
    ("second different protocol", ["UDP/127.0.0.1/8001"], ["TCP/0.0.0.0/8001"], FITS),
    (
        "UDP hostPort conflict due to 0.0.0.0 hostIP",
        ["UDP/127.0.0.1/8001"],
        ["TCP/0.0.0.0/8001", "UDP/0.0.0.0/8001"],
        CONFLICT,
    ),
]

NOT_EXPRESSIBLE: dict[str, str] = {}


def with_ports(name: str, ports: list[str]) -> dict[str, object]:
    listed = []
    for port in ports:
        protocol, ip, number = port.split("/")
        listed.append({"containerPort": int(number), "hostIP": ip, "hostPort": int(number), "protocol": protocol})
    return {"containers": [container("c", ports=listed)]} if listed else {}


@pytest.mark.parametrize(("wanted", "used", "expected"), [pytest.param(*c[1:], id=case_id(TEST, c[0])) for c in CASES])
def test_node_ports(wanted: list[str], used: list[str], expected: object) -> None:
    existing = [(pod("existing", with_ports("existing", used)), "m1")] if used else []
    e = engine([node("m1")], existing)
    assert verdict(e.filter_node("m1", pod("incoming", with_ports("incoming", wanted)))) == expected
