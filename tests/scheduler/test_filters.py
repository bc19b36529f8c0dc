"""Kubernetes' own filters in the engine, table by table, with kube-scheduler 1.20's reason strings.

Each table is a story a platform team would recognise: a pod asks for zone b, for a free host port, for a spread of
replicas, and the engine answers as kube-scheduler would, with the same `0/N nodes are available: ...` sentence.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import PodRequest, Requirement
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler import filters, scores
from kubegpu.scheduler.engine import Engine

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def engine(**plugins: object) -> Engine:
    return Engine(make_plugin_manager("scheduler", plugins=plugins.items(), autoload=False))


def node(name: str, zone: str = "a", **kwargs: Any) -> dict[str, Any]:
    labels = {HOST: name, ZONE: zone, **kwargs.pop("labels", {})}
    return node_manifest(name, labels=labels, **kwargs)


def pod(name: str, spec: dict[str, Any] | None = None, **meta: Any) -> PodRequest:
    document = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": meta.pop("namespace", "default"), **meta},
        "spec": {"containers": [{"name": "main"}], **(spec or {})},
    }
    request, _ = pod_request(document)
    return request


def cluster(*nodes: dict[str, Any], **plugins: object) -> Engine:
    e = engine(**plugins)
    for manifest in nodes:
        e.add_node(node_info(manifest))
    return e


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
        }
    }


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)} if values else {"key": key, "operator": operator}


# ---------------------------------------------------------------------------------------------------------------
# NodeAffinity
# ---------------------------------------------------------------------------------------------------------------

NODES = [
    node("a1", "a", labels={"gen": "3", "disk": "ssd"}),
    node("b1", "b", labels={"gen": "5"}),
    node("c1", "c", labels={"gen": "x", "disk": "hdd"}),
]


@pytest.mark.parametrize(
    ("terms", "placed"),
    [
        ([{"matchExpressions": [expr(ZONE, "In", "b")]}], {"b1"}),
        ([{"matchExpressions": [expr(ZONE, "NotIn", "a", "b")]}], {"c1"}),
        ([{"matchExpressions": [expr("disk", "Exists")]}], {"a1", "c1"}),
        ([{"matchExpressions": [expr("disk", "DoesNotExist")]}], {"b1"}),
        ([{"matchExpressions": [expr("gen", "Gt", "4")]}], {"b1"}),
        ([{"matchExpressions": [expr("gen", "Lt", "4")]}], {"a1"}),
        ([{"matchExpressions": [expr("disk", "NotIn", "hdd")]}], {"a1", "b1"}),
        ([{"matchExpressions": [expr(ZONE, "In", "a", "c"), expr("disk", "In", "hdd")]}], {"c1"}),
        ([{"matchExpressions": [expr(ZONE, "In", "a")]}, {"matchExpressions": [expr(ZONE, "In", "b")]}], {"a1", "b1"}),
        ([{"matchFields": [expr("metadata.name", "In", "c1")]}], {"c1"}),
        ([{"matchFields": [expr("metadata.name", "NotIn", "c1")]}], {"a1", "b1"}),
        ([{"matchFields": [expr("metadata.name", "In", "a1", "b1")]}], set()),
        (
            [{"matchExpressions": [expr(ZONE, "In", "a", "b")], "matchFields": [expr("metadata.name", "In", "b1")]}],
            {"b1"},
        ),
        ([{}], set()),
        ([{"matchExpressions": [expr(ZONE, "NotIn", "a", "not a label value")]}], set()),
        ([{"matchExpressions": [expr(ZONE, "In", "b", "x" * 64)]}], set()),
        ([{"matchExpressions": [expr("gen", "Gt", "+4")]}], set()),
        ([{"matchExpressions": [expr("no spaces in keys", "DoesNotExist")]}], set()),
        (
            [{"matchExpressions": [expr(ZONE, "NotIn", "a b")]}, {"matchExpressions": [expr(ZONE, "In", "c")]}],
            {"c1"},
        ),
    ],
    ids=[
        "in",
        "notin",
        "exists",
        "does-not-exist",
        "gt",
        "lt-not-a-number-never-matches",
        "notin-absent-key-matches",
        "expressions-anded",
        "terms-ored",
        "match-fields-name",
        "match-fields-notin",
        "match-fields-two-values-invalid",
        "expressions-and-fields",
        "empty-term-selects-nothing",
        "notin-invalid-value-term-selects-nothing",
        "in-value-too-long-term-selects-nothing",
        "gt-signed-value-is-no-label-value",
        "invalid-key-term-selects-nothing",
        "invalid-term-skipped-next-term-holds",
    ],
)
def test_required_node_affinity_selects_nodes_as_kube_scheduler(terms: list[dict[str, Any]], placed: set[str]) -> None:
    e = cluster(*NODES)
    probe = pod("p", required(*terms))
    fits = {name for name in e.nodes if e.filter_node(name, probe).ok}
    assert fits == placed
    if not placed:
        assert e.schedule(probe).reason == "0/3 nodes are available: 3 node(s) didn't match node selector."


@pytest.mark.parametrize(
    ("label", "matches"),
    [("10", True), ("1_0", False), (" 10", False), ("+10", True), ("99999999999999999999", False)],
    ids=["digits", "underscore", "space", "sign", "beyond-int64"],
)
def test_gt_reads_a_node_label_as_go_parses_an_integer(label: str, matches: bool) -> None:
    """kube-scheduler compares with `strconv.ParseInt`: Python's `int` would read `1_0` and ` 10` as 10."""
    requirement = Requirement("gen", "Gt", ("4",))
    assert filters.requirement_matches(requirement, {"gen": label}) is matches


def test_remembered_term_validity_agrees_with_judging_afresh() -> None:
    """The per-term memo of validity (`filters._TERMS_CHECKED`) against the same question asked with the memo
    emptied: terms asked in turn, equal terms built apart, and terms made and dropped so that a new one may take a
    dropped one's id."""
    labels = {ZONE: "b", HOST: "n1"}
    asked = []
    for i in range(200):
        value = "a b" if i % 3 == 0 else "a"
        [term] = pod(f"p{i}", required({"matchExpressions": [expr(ZONE, "NotIn", value)]})).node_affinity or ()
        asked.append(term)
        remembered = filters.node_matches_terms((term,), "n1", labels)
        again = filters.node_matches_terms((asked[i // 2],), "n1", labels)
        filters._TERMS_CHECKED.clear()
        assert remembered == filters.node_matches_terms((term,), "n1", labels) == (value == "a")
        assert again == filters.node_matches_terms((asked[i // 2],), "n1", labels)
        if i % 2:
            asked[i] = asked[i - 1]  # drop this term object: its id may be reused by the next one


def test_a_pod_asking_for_zone_b_never_lands_in_zone_a() -> None:
    e = cluster(node("a1", "a"), node("a2", "a"), node("b1", "b", cpu="1"))
    decision = e.schedule(pod("p", required({"matchExpressions": [expr(ZONE, "In", "b")]})))
    assert decision.node == "b1"


def test_a_hostname_node_selector_is_not_settled_for_the_whole_node_class() -> None:
    e = cluster(*(node(f"n{i}", "a") for i in range(6)))
    for i in range(6):
        assert e.schedule(pod(f"p{i}", {"nodeSelector": {HOST: f"n{i}"}})).node == f"n{i}"


# ---------------------------------------------------------------------------------------------------------------
# NodePorts
# ---------------------------------------------------------------------------------------------------------------


def ports(*entries: tuple[int, str, str]) -> dict[str, Any]:
    listed = [{"containerPort": p, "hostPort": p, "protocol": proto, "hostIP": ip} for p, proto, ip in entries]
    return {"containers": [{"name": "main", "ports": listed}]}


@pytest.mark.parametrize(
    ("held", "wanted", "conflict"),
    [
        ((8080, "TCP", ""), (8080, "TCP", ""), True),
        ((8080, "TCP", ""), (8080, "UDP", ""), False),
        ((8080, "TCP", ""), (8081, "TCP", ""), False),
        ((8080, "TCP", "10.0.0.1"), (8080, "TCP", "10.0.0.2"), False),
        ((8080, "TCP", "10.0.0.1"), (8080, "TCP", "10.0.0.1"), True),
        ((8080, "TCP", "10.0.0.1"), (8080, "TCP", "0.0.0.0"), True),
        ((8080, "TCP", ""), (8080, "TCP", "10.0.0.2"), True),
        ((53, "UDP", "127.0.0.1"), (53, "UDP", ""), True),
    ],
    ids=[
        "same-port",
        "other-protocol",
        "other-port",
        "other-ip",
        "same-ip",
        "wanted-on-every-ip",
        "held-on-every-ip",
        "udp-on-every-ip",
    ],
)
def test_host_ports_conflict_as_kubernetes_compares_them(
    held: tuple[int, str, str], wanted: tuple[int, str, str], conflict: bool
) -> None:
    e = cluster(node("n1"))
    assert e.schedule(pod("first", ports(held))).scheduled
    decision = e.schedule(pod("second", ports(wanted)))
    assert decision.scheduled is not conflict
    if conflict:
        assert decision.reason == (
            "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."
        )


def test_two_pods_with_host_port_8080_take_two_nodes_and_a_deletion_frees_the_port() -> None:
    e = cluster(node("n1"), node("n2"))
    first = e.schedule(pod("web-0", ports((8080, "TCP", ""))))
    second = e.schedule(pod("web-1", ports((8080, "TCP", ""))))
    assert {first.node, second.node} == {"n1", "n2"}
    assert not e.schedule(pod("web-2", ports((8080, "TCP", "")))).scheduled
    e.release("default/web-0")
    assert e.schedule(pod("web-2", ports((8080, "TCP", "")))).node == first.node


# ---------------------------------------------------------------------------------------------------------------
# NodeResourcesFit, NodeUnschedulable
# ---------------------------------------------------------------------------------------------------------------


def container(name: str, requests: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": requests}}


@pytest.mark.parametrize(
    ("spec", "fits"),
    [
        ({"containers": [container("a", {"cpu": "2"}), container("b", {"cpu": "2"})]}, True),
        ({"containers": [container("a", {"cpu": "3"}), container("b", {"cpu": "2"})]}, False),
        ({"containers": [container("a", {"cpu": "1"})], "initContainers": [container("i", {"cpu": "4"})]}, True),
        ({"containers": [container("a", {"cpu": "1"})], "initContainers": [container("i", {"cpu": "5"})]}, False),
        (
            {
                "containers": [container("app", {"cpu": "3"})],
                "initContainers": [{**container("proxy", {"cpu": "2"}), "restartPolicy": "Always"}],
            },
            False,
        ),
        (
            {
                "containers": [container("app", {"cpu": "2"})],
                "initContainers": [{**container("proxy", {"cpu": "2"}), "restartPolicy": "Always"}],
            },
            True,
        ),
        ({"containers": [container("a", {"cpu": "3"})], "overhead": {"cpu": "1"}}, True),
        ({"containers": [container("a", {"cpu": "3500m"})], "overhead": {"cpu": "1"}}, False),
        ({"containers": [container("a", {"example.com/widget": "2"})]}, True),
        ({"containers": [container("a", {"example.com/widget": "3"})]}, False),
        ({"containers": [container("a", {"hugepages-2Mi": "4Mi"})]}, True),
        ({"containers": [container("a", {"ephemeral-storage": "20Gi"})]}, False),
    ],
    ids=[
        "containers-sum",
        "containers-sum-too-large",
        "init-container-max",
        "init-container-too-large",
        "sidecar-beside-the-app-too-large",
        "sidecar-beside-the-app",
        "overhead-added",
        "overhead-tips-it-over",
        "extended",
        "extended-too-large",
        "hugepages",
        "ephemeral-storage",
    ],
)
def test_every_requested_resource_must_fit_allocatable(spec: dict[str, Any], fits: bool) -> None:
    allocatable = {"example.com/widget": 2, "hugepages-2Mi": "4Mi", "ephemeral-storage": "10Gi"}
    e = cluster(node("n1", cpu="4", allocatable=allocatable))
    assert e.filter_node("n1", pod("p", spec)).ok is fits


def test_resource_shortages_are_all_named() -> None:
    e = cluster(node("n1", memory="1Gi", allocatable={"ephemeral-storage": "1Gi"}))
    spec = {"containers": [container("a", {"cpu": "2", "memory": "2Gi", "ephemeral-storage": "2Gi"})]}
    assert e.schedule(pod("p", spec)).reason == (
        "0/1 nodes are available: 1 Insufficient ephemeral-storage, 1 Insufficient memory."
    )


@pytest.mark.parametrize(
    ("labels", "allocatable", "resource"),
    [
        ({"node.kubernetes.io/instance-type": "inf2.48xlarge"}, {}, neuron.NEURON),
        ({"node.kubernetes.io/instance-type": "inf2.48xlarge"}, {neuron.NEURON: 12}, neuron.NEURONDEVICE),
        ({"node.kubernetes.io/instance-type": "trn1.32xlarge"}, {neuron.NEURONDEVICE: 16}, neuron.NEURON),
        ({"nvidia.com/gpu.count": "8"}, {}, nvidia.RESOURCE),
    ],
    ids=[
        "inf2-label-without-allocatable",
        "neuron-is-not-neurondevice",
        "neurondevice-is-not-neuron",
        "gpu-count-label",
    ],
)
def test_device_pods_go_only_where_allocatable_advertises_the_resource(
    labels: dict[str, str], allocatable: dict[str, int], resource: str
) -> None:
    e = cluster(node("n1", labels=labels, allocatable=allocatable), neuron=neuron, nvidia=nvidia)
    decision = e.schedule(pod("p", {"containers": [{"name": "main", "resources": {"limits": {resource: "1"}}}]}))
    assert decision.reason == f"0/1 nodes are available: 1 Insufficient {resource}."


def test_a_sidecars_gpus_are_allocated_beside_the_apps_on_one_node() -> None:
    """A sidecar runs for the pod's life, so the kubelet keeps its devices apart from the app's: a 3-GPU app with a
    2-GPU sidecar needs 5 GPUs, and each container gets its own."""
    gpus = {"nvidia.com/gpu.count": "4"}
    e = cluster(node("n1", labels=gpus, allocatable={nvidia.RESOURCE: 4}), nvidia=nvidia)

    def spec(app: int, sidecar: int) -> dict[str, Any]:
        limits = {"resources": {"limits": {nvidia.RESOURCE: str(app)}}}
        side = {"name": "monitor", "restartPolicy": "Always", "resources": {"limits": {nvidia.RESOURCE: str(sidecar)}}}
        return {"containers": [{"name": "main", **limits}], "initContainers": [side]}

    refused = e.schedule(pod("big", spec(3, 2)))
    assert refused.reason == f"0/1 nodes are available: 1 Insufficient {nvidia.RESOURCE}."
    placed = e.schedule(pod("small", spec(2, 1)))
    assert placed.allocation is not None
    devices = placed.allocation.containers
    assert len(devices["main"][nvidia.RESOURCE]) == 2 and len(devices["monitor"][nvidia.RESOURCE]) == 1
    assert not set(devices["main"][nvidia.RESOURCE]) & set(devices["monitor"][nvidia.RESOURCE])


def test_a_cordoned_node_takes_only_pods_tolerating_unschedulable() -> None:
    cordoned = node("n1")
    cordoned["spec"]["unschedulable"] = True
    e = cluster(cordoned)
    assert e.schedule(pod("p")).reason == "0/1 nodes are available: 1 node(s) were unschedulable."
    tolerant = {
        "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]
    }
    assert e.schedule(pod("q", tolerant)).scheduled


# ---------------------------------------------------------------------------------------------------------------
# InterPodAffinity
# ---------------------------------------------------------------------------------------------------------------


def term(key: str, labels: dict[str, str], namespaces: list[str] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"topologyKey": key, "labelSelector": {"matchLabels": labels}}
    if namespaces is not None:
        found["namespaces"] = namespaces
    return found


def affinity(kind: str, *terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}}


def test_three_replicas_with_hostname_anti_affinity_take_three_nodes() -> None:
    e = cluster(node("n1"), node("n2"), node("n3"))
    spec = affinity("podAntiAffinity", term(HOST, {"app": "web"}))
    placed = [e.schedule(pod(f"web-{i}", spec, labels={"app": "web"})).node for i in range(4)]
    assert sorted(placed[:3]) == ["n1", "n2", "n3"]
    assert placed[3] is None
    refused = e.schedule(pod("web-4", spec, labels={"app": "web"}))
    assert refused.reason == (
        "0/3 nodes are available: 3 node(s) didn't match pod affinity/anti-affinity, "
        "3 node(s) didn't match pod anti-affinity rules."
    )


def test_existing_pods_anti_affinity_keeps_matching_pods_out_of_their_zone() -> None:
    e = cluster(node("a1", "a"), node("a2", "a"), node("b1", "b", cpu="1"))
    guard = affinity("podAntiAffinity", term(ZONE, {"app": "noisy"}))
    assert e.schedule(pod("guard", {**guard, "nodeSelector": {HOST: "a1"}}, labels={"app": "guard"})).node == "a1"
    assert e.schedule(pod("noisy", labels={"app": "noisy"})).node == "b1"
    assert e.schedule(pod("calm", labels={"app": "calm"})).scheduled
    e.release("default/noisy")
    blocked = e.schedule(pod("noisy-2", {"nodeSelector": {ZONE: "a"}}, labels={"app": "noisy"}))
    assert blocked.reason == (
        "0/3 nodes are available: 1 node(s) didn't match node selector, "
        "2 node(s) didn't match pod affinity/anti-affinity, 2 node(s) didn't satisfy existing pods anti-affinity rules."
    )


def test_pod_affinity_follows_its_peer_and_the_first_of_a_group_goes_anywhere() -> None:
    e = cluster(node("a1", "a"), node("b1", "b"), node("b2", "b"))
    db = e.schedule(pod("db", {"nodeSelector": {HOST: "b2"}}, labels={"app": "db"}))
    assert db.node == "b2"
    spec = affinity("podAffinity", term(ZONE, {"app": "db"}))
    assert {e.schedule(pod(f"api-{i}", spec)).node for i in range(4)} <= {"b1", "b2"}
    lonely = affinity("podAffinity", term(ZONE, {"app": "cache"}))
    assert e.schedule(pod("first-cache", lonely, labels={"app": "cache"})).scheduled
    orphan = e.schedule(pod("orphan", affinity("podAffinity", term(ZONE, {"app": "nothing"}))))
    assert orphan.reason == (
        "0/3 nodes are available: 3 node(s) didn't match pod affinity rules, "
        "3 node(s) didn't match pod affinity/anti-affinity."
    )


def test_affinity_terms_read_their_own_namespace_unless_they_name_others() -> None:
    e = cluster(node("a1", "a"), node("b1", "b"))
    e.schedule(pod("db", {"nodeSelector": {ZONE: "b"}}, labels={"app": "db"}, namespace="data"))
    same_namespace = affinity("podAffinity", term(ZONE, {"app": "db"}))
    assert not e.schedule(pod("api", same_namespace, namespace="web")).scheduled
    named = affinity("podAffinity", term(ZONE, {"app": "db"}, namespaces=["data"]))
    assert e.schedule(pod("api-2", named, namespace="web")).node == "b1"


# ---------------------------------------------------------------------------------------------------------------
# PodTopologySpread
# ---------------------------------------------------------------------------------------------------------------


def spread(key: str, skew: int = 1, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "topologySpreadConstraints": [
            {
                "maxSkew": skew,
                "topologyKey": key,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": labels or {"app": "web"}},
            }
        ]
    }


def test_replicas_spread_over_zones_within_max_skew() -> None:
    e = cluster(node("a1", "a"), node("a2", "a"), node("b1", "b"), node("c1", "c", cpu="2"))
    zones = []
    for i in range(9):
        decision = e.schedule(pod(f"web-{i}", spread(ZONE), labels={"app": "web"}))
        zones.append(e.nodes[decision.node or ""].info.labels[ZONE])
    assert sorted(zones.count(z) for z in "abc") == [3, 3, 3]


def test_spread_counts_only_nodes_the_pod_may_use_and_names_missing_labels() -> None:
    e = cluster(node("a1", "a"), node("b1", "b"), node_manifest("bare", labels={"pool": "x"}))
    spec = {**spread(ZONE), "nodeSelector": {ZONE: "a"}}
    assert [e.schedule(pod(f"w{i}", spec, labels={"app": "web"})).node for i in range(3)] == ["a1"] * 3
    refused = e.schedule(pod("x", {"nodeSelector": {"pool": "x"}, **spread(ZONE)}, labels={"app": "web"}))
    assert refused.reason == (
        "0/3 nodes are available: 1 node(s) didn't match pod topology spread constraints (missing required label), "
        "2 node(s) didn't match node selector."
    )


def test_spread_refusal_reads_like_kube_scheduler() -> None:
    tainted = node("b1", "b", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}])
    e = cluster(node("a1", "a"), tainted)
    assert e.schedule(pod("w0", spread(ZONE), labels={"app": "web"})).node == "a1"
    refused = e.schedule(pod("w1", spread(ZONE), labels={"app": "web"}))
    assert refused.reason == (
        "0/2 nodes are available: 1 node(s) didn't match pod topology spread constraints, "
        "1 node(s) had taint {dedicated: x}, that the pod didn't tolerate."
    )


# ---------------------------------------------------------------------------------------------------------------
# VolumeBinding
# ---------------------------------------------------------------------------------------------------------------


def test_bound_claims_follow_their_volume_and_unbound_claims_are_refused_with_a_reason() -> None:
    e = cluster(node("a1", "a"), node("b1", "b"))
    e.track_volumes = True
    e.set_claim("default", "data", "pv-b")
    e.set_claim("default", "scratch", "")
    e.set_volume("pv-b", pod("x", required({"matchExpressions": [expr(ZONE, "In", "b")]})).node_affinity)
    volume = {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}
    assert e.schedule(pod("db", volume)).node == "b1"
    assert e.schedule(pod("db2", {**volume, "nodeSelector": {ZONE: "a"}})).reason == (
        "0/2 nodes are available: 1 node(s) didn't match node selector, 1 node(s) had volume node affinity conflict."
    )
    unbound = {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "scratch"}}]}
    assert "pod has unbound immediate PersistentVolumeClaims" in (e.schedule(pod("u", unbound)).reason or "")
    missing = {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "nope"}}]}
    assert 'persistentvolumeclaim "nope" not found' in (e.schedule(pod("m", missing)).reason or "")


# ---------------------------------------------------------------------------------------------------------------
# The engine's memory of answers stays true when answers depend on other nodes
# ---------------------------------------------------------------------------------------------------------------

APPS = ["web", "db", "cache"]


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    shapes = []
    for i in range(draw(st.integers(4, 14))):
        app = draw(st.sampled_from(APPS))
        other = draw(st.sampled_from(APPS))
        kind = draw(st.sampled_from(["plain", "anti-host", "anti-zone", "affinity-zone", "spread", "port"]))
        spec: dict[str, Any] = {}
        if kind == "anti-host":
            spec = affinity("podAntiAffinity", term(HOST, {"app": other}))
        elif kind == "anti-zone":
            spec = affinity("podAntiAffinity", term(ZONE, {"app": other}))
        elif kind == "affinity-zone":
            spec = affinity("podAffinity", term(ZONE, {"app": other}))
        elif kind == "spread":
            spec = spread(draw(st.sampled_from([ZONE, HOST])), labels={"app": app})
        elif kind == "port":
            spec = ports((8080, "TCP", ""))
        shapes.append((f"p{i}", spec, {"app": app}))
    return shapes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.lists(st.integers(0, 13), max_size=4))
def test_remembered_answers_equal_fresh_ones_after_every_change(
    shapes: list[tuple[str, dict[str, Any], dict[str, str]]], deletions: list[int]
) -> None:
    e = cluster(node("a1", "a"), node("a2", "a"), node("b1", "b"), node("b2", "b"), node("c1", "c"))
    pods = [pod(name, spec, labels=labels) for name, spec, labels in shapes]
    placed: list[str] = []
    for index, request in enumerate(pods):
        if index in deletions and placed:
            e.release(placed.pop(0))
        for probe in pods:
            remembered = {name: e.filter_node(name, probe) for name in e.nodes}
            for record in e.nodes.values():
                record.last_check = {}
            e._plans.clear()
            fresh = {name: e.filter_node(name, probe) for name in e.nodes}
            assert {n: s.ok for n, s in remembered.items()} == {n: s.ok for n, s in fresh.items()}
        if e.schedule(request).scheduled:
            placed.append(request.key)
    for key in placed:
        assert filters.ports_conflict((), e.nodes[e.pods[key].node].ports) is False


def test_with_node_resources_fit_disabled_a_pod_larger_than_free_cpu_is_placed_as_kube_scheduler_places_it() -> None:
    """kube-scheduler with NodeResourcesFit disabled reads no requests in its filters: a 16-cpu pod goes on a 4-cpu
    node. The engine's cpu capacity index must not filter in its place, nor name `Insufficient cpu`."""
    profile = replace(scores.Profile.default(), filters_off=frozenset({"NodeResourcesFit"}))
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), scoring=profile)
    e.add_node(node_info(node("small", cpu="4")))
    big = pod("big", {"containers": [{"name": "main", "resources": {"requests": {"cpu": "16"}}}]})
    decision = e.schedule(big)
    assert decision.node == "small", decision.reason
