"""A pod (anti-)affinity term's `namespaceSelector` (1.22+, GA 1.24) as kube-scheduler reads it.

A term selects the pods of the namespaces it lists and of those whose labels its namespace selector matches; `{}`
matches every namespace, and a term with neither selects the owning pod's namespace only. The labels are the
Namespace objects' (the engine's `set_namespace`, fed by the live front-ends' namespaces informer and by Namespace
documents in `kubegpu simulate`); a namespace whose object is not known has only the name label the API server sets.
The upstream objects' shape is what these tests write: an API server of 1.20 (the one the integration tests run)
drops the field, so this is tested here, on the engine every front-end shares.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from kubegpu.core.manifests import ManifestError, node_info, pod_request
from kubegpu.core.models import LabelSelector, Requirement
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.scheduler import filters
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.extender import ExtenderServer

from . import test_live_owners as live
from .test_service_guards import schedule_all

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def engine(zones: dict[str, str]) -> Engine:
    e = Engine(make_plugin_manager("scheduler", plugins=[], autoload=False))
    for name, zone in zones.items():
        e.add_node(node_info(node_manifest(name, labels={ZONE: zone, HOST: name}, cpu="8")))
    return e


def pod(
    name: str, namespace: str, labels: dict[str, str], *, anti: dict[str, Any] | None = None, affinity: bool = False
) -> Any:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"requests": {"cpu": "100m"}}}]}
    if anti is not None:
        kind = "podAffinity" if affinity else "podAntiAffinity"
        spec["affinity"] = {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [anti]}}
    document = {"kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": spec}
    return pod_request(document)[0]


def away_from_db(**fields: Any) -> dict[str, Any]:
    return {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": "db"}}, **fields}


def placed(e: Engine, name: str, namespace: str, labels: dict[str, str], node: str, **kwargs: Any) -> None:
    e.admit_bound(pod(name, namespace, labels, **kwargs), node, None)


def test_the_manifest_keeps_an_empty_selector_apart_from_an_absent_one() -> None:
    owner = "team-b"

    def term(**fields: Any) -> Any:
        return pod("p", owner, {}, anti=away_from_db(**fields)).pod_anti_affinity[0]

    assert (term().namespaces, term().namespace_selector) == (frozenset({owner}), None)
    every = term(namespaceSelector={})
    assert (every.namespaces, every.namespace_selector) == (frozenset(), LabelSelector())
    both = term(namespaces=["x"], namespaceSelector={"matchLabels": {"team": "ml"}})
    assert both.namespaces == frozenset({"x"})
    assert both.namespace_selector == LabelSelector((Requirement("team", "In", ("ml",)),))
    with pytest.raises(ManifestError, match=r"namespaceSelector\.matchExpressions"):
        term(namespaceSelector={"matchExpressions": [{"key": "team", "operator": "Near"}]})


def test_an_empty_namespace_selector_keeps_away_from_every_namespaces_pods() -> None:
    """A tenant's database in namespace team-a runs in zone z1; a pod of team-b keeping away from databases in every
    namespace goes to z2. The same term without the selector reads only team-b, and z1 is as good as z2."""
    e = engine({"n1": "z1", "n2": "z2"})
    placed(e, "db", "team-a", {"app": "db"}, "n1")
    for attempt in range(4):
        decision = e.schedule(pod(f"web-{attempt}", "team-b", {}, anti=away_from_db(namespaceSelector={})))
        assert decision.node == "n2"
    own_namespace_only = [e.schedule(pod(f"own-{i}", "team-b", {}, anti=away_from_db())).node for i in range(4)]
    assert "n1" in own_namespace_only


def test_a_labelled_namespace_selector_follows_the_namespaces_labels() -> None:
    """Kept away from the databases of namespaces labelled `tier: prod`: team-a's database counts only while its
    namespace has the label, and a relabel is read at the next cycle (no answer remembered from before it)."""
    e = engine({"n1": "z1"})
    placed(e, "db", "team-a", {"app": "db"}, "n1")
    prod = away_from_db(namespaceSelector={"matchLabels": {"tier": "prod"}})
    assert e.schedule(pod("a", "team-b", {}, anti=prod)).node == "n1"  # team-a unknown: only its name label
    assert e.set_namespace("team-a", {"tier": "prod"})
    refused = e.schedule(pod("b", "team-b", {}, anti=prod))
    assert not refused.scheduled
    assert refused.reason == (
        "0/1 nodes are available: 1 node(s) didn't match pod affinity/anti-affinity, "
        "1 node(s) didn't match pod anti-affinity rules."
    )
    assert not e.set_namespace("team-a", {"tier": "prod"}), "the same labels again change nothing"
    assert e.set_namespace("team-a", {"tier": "dev"})
    assert e.schedule(pod("c", "team-b", {}, anti=prod)).node == "n1"


def test_a_placed_pods_term_reads_the_incoming_pods_namespace_labels() -> None:
    """A placed pod's anti-affinity against the pods of every `sandbox` namespace refuses its node to a pod of such a
    namespace, and to no other pod; relabelling the newcomer's namespace changes that at once, even for a pod whose
    plan the engine remembers (the plan of a pod no term selects skips the cluster-wide rules)."""
    e = engine({"n1": "z1", "n2": "z2"})
    guard = {"topologyKey": HOST, "labelSelector": {}, "namespaceSelector": {"matchLabels": {"sandbox": "true"}}}
    placed(e, "guard", "system", {"app": "guard"}, "n1", anti=guard)
    e.set_namespace("untrusted", {"sandbox": "true"})
    e.set_namespace("trusted", {})
    for i in range(3):
        assert e.schedule(pod(f"u{i}", "untrusted", {"app": "job"})).node == "n2"
    nodes = {e.schedule(pod(f"t{i}", "trusted", {"app": "job"})).node for i in range(6)}
    assert nodes == {"n1", "n2"}
    probe = pod("again", "trusted", {"app": "job"})
    assert not e.plan(probe).volatile
    e.set_namespace("trusted", {"sandbox": "true"})
    assert e.plan(probe).volatile, "the remembered plan is made again"
    for i in range(3):
        assert e.schedule(pod(f"late{i}", "trusted", {"app": "job"})).node == "n2"


def test_affinity_to_pods_of_namespaces_named_by_the_name_label() -> None:
    """The name label every API server of 1.21+ sets: affinity to `cache` pods in namespaces team-a or team-c."""
    e = engine({"n1": "z1", "n2": "z2", "n3": "z3"})
    placed(e, "cache-a", "team-b", {"app": "cache"}, "n1")  # not named
    placed(e, "cache-c", "team-c", {"app": "cache"}, "n3")
    term = {
        "topologyKey": ZONE,
        "labelSelector": {"matchLabels": {"app": "cache"}},
        "namespaceSelector": {
            "matchExpressions": [
                {"key": filters.NAMESPACE_NAME_LABEL, "operator": "In", "values": ["team-a", "team-c"]}
            ]
        },
    }
    for i in range(3):
        assert e.schedule(pod(f"p{i}", "team-b", {}, anti=term, affinity=True)).node == "n3"


def test_pod_matches_term_as_kube_scheduler_matches_an_affinity_term() -> None:
    """`AffinityTerm.Matches`: the namespace listed, or its labels matched by the selector (an empty selector
    matches every namespace, a namespace without an object has only its name label), and the pod's labels."""
    web = pod("w", "team-b", {"app": "web"})
    labels = {"team-b": {"tier": "prod"}}.get
    term = pod("p", "x", {}, anti={"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "web"}}})
    listed = term.pod_anti_affinity[0]
    assert not filters.pod_matches_term(listed, web)
    cases: tuple[tuple[dict[str, Any], bool], ...] = (
        ({}, True),
        ({"matchLabels": {"tier": "prod"}}, True),
        ({"matchLabels": {"tier": "dev"}}, False),
    )
    for selector, expected in cases:
        anti = {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "web"}}, "namespaceSelector": selector}
        chosen = pod("p", "x", {}, anti=anti).pod_anti_affinity[0]
        assert filters.pod_matches_term(chosen, web, lambda ns: labels(ns) or {}) is expected
    named = {"matchExpressions": [{"key": filters.NAMESPACE_NAME_LABEL, "operator": "In", "values": ["team-b"]}]}
    anti = {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "web"}}, "namespaceSelector": named}
    assert filters.pod_matches_term(pod("p", "x", {}, anti=anti).pod_anti_affinity[0], web)


def test_the_custom_scheduler_reads_namespace_labels_from_its_informer_and_retries_on_a_relabel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The custom scheduler's namespaces informer: a pod of namespace `lab`, labelled `sandbox: "true"` in the first
    list, is kept off the only node by a placed pod's anti-affinity against every sandbox namespace's pods; when the
    label is taken off (a MODIFIED event) the pod is tried again and binds, with no other change in the cluster."""
    service = live.start()
    guard = pod_manifest("guard", namespace="system", scheduler_name="kubegpu")
    guard["metadata"].update(uid="uid-guard", resourceVersion="1")
    guard["spec"].update(
        nodeName="a1",
        affinity={
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOST, "labelSelector": {}, "namespaceSelector": {"matchLabels": {"sandbox": "1"}}}
                ]
            }
        },
    )
    job = pod_manifest("job", namespace="lab", scheduler_name="kubegpu", node_selector={HOST: "a1"})
    job["metadata"].update(uid="uid-job", resourceVersion="1")
    lab = {"metadata": {"name": "lab", "labels": {"sandbox": "1"}, "resourceVersion": "1"}}
    service.mirror.on_namespaces("SYNC", [lab, {"metadata": {"name": "system"}}])
    service.mirror.on_pods("SYNC", [guard, job])
    service.mirror.on_claims("SYNC", [])
    service.mirror.on_volumes("SYNC", [])
    live.sync_owners(service)
    assert service.mirror.ready()
    schedule_all(service)
    assert live.placed(service) == []
    assert "job" in "".join(service.queue.unschedulable)

    service.mirror.on_namespaces("MODIFIED", {"metadata": {"name": "lab", "labels": {}, "resourceVersion": "2"}})
    assert not service.queue.unschedulable, "the relabel woke the pod"
    later = time.monotonic() + 60  # its backoff waited out
    monkeypatch.setattr(time, "monotonic", lambda: later)  # the queue's clock
    service.queue.promote()
    schedule_all(service)
    assert live.placed(service) == ["a1"]


def extender_over(zones: dict[str, str], namespaces: dict[str, dict[str, str]]) -> ExtenderServer:
    """An extender fed as its informers feed it: nodes by zone, and the Namespace objects with their labels."""
    server = ExtenderServer(Engine(make_plugin_manager("scheduler", plugins=[], autoload=False)), None, None)  # type: ignore[arg-type]
    server.mirror.on_nodes("SYNC", [node_manifest(n, labels={ZONE: z, HOST: n}, cpu="8") for n, z in zones.items()])
    objects = [{"metadata": {"name": n, "labels": labels, "resourceVersion": "1"}} for n, labels in namespaces.items()]
    server.mirror.on_namespaces("SYNC", objects)
    return server


def manifest(name: str, namespace: str, labels: dict[str, str], node: str = "", **spec: Any) -> dict[str, Any]:
    document = pod_manifest(name, namespace=namespace)
    document["metadata"].update(uid=f"uid-{name}", resourceVersion="1", labels=labels)
    document["spec"].update(spec, **({"nodeName": node} if node else {}))
    return document


PROD_DB_AWAY = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    away_from_db(namespaceSelector={"matchLabels": {"tier": "prod"}})
]}}  # fmt: skip


def relabel(server: ExtenderServer, namespace: str, labels: dict[str, str]) -> None:
    meta = {"name": namespace, "labels": labels, "resourceVersion": "2"}
    server.mirror.on_namespaces("MODIFIED", {"metadata": meta})


def test_the_extenders_answers_for_a_pod_shape_follow_a_namespace_relabel() -> None:
    """The extender remembers its answers per pod shape until a node changes; a relabel changes no node. team-a's
    database in z1 keeps team-b's replicas (away from prod databases) out of z1 while team-a is `tier: prod`; once
    it is `tier: dev` the next replica may go to z1 too (before: n1 stayed refused, as remembered for the shape)."""
    server = extender_over({"n1": "z1", "n2": "z2"}, {"team-a": {"tier": "prod"}, "team-b": {}})
    server.mirror.on_pods("SYNC", [manifest("db", "team-a", {"app": "db"}, "n1")])

    def filtered(name: str) -> tuple[list[str], list[str]]:
        body = {"Pod": manifest(name, "team-b", {"app": "web"}, affinity=PROD_DB_AWAY), "NodeNames": ["n1", "n2"]}
        answer = server.filter(orjson.dumps(body))
        return answer["NodeNames"], sorted(answer["FailedNodes"])

    assert filtered("web-0") == (["n2"], ["n1"])
    relabel(server, "team-a", {"tier": "dev"})
    assert filtered("web-1") == (["n1", "n2"], [])
    relabel(server, "team-a", {"tier": "prod"})
    assert filtered("web-2") == (["n2"], ["n1"])


def test_the_extenders_gang_plan_follows_a_namespace_relabel() -> None:
    """The extender answers a gang's members from one plan of the whole gang, kept until a node or the gang changes.
    Two members of 5 CPUs each fit only one per node; once team-a becomes `tier: prod`, its database keeps them out of
    z1 and the gang cannot be placed whole: no member may pass (before: the plan made before the relabel still sent
    a member to n2, to be bound alone)."""
    server = extender_over({"n1": "z1", "n2": "z2"}, {"team-a": {"tier": "dev"}, "team-b": {}})
    meta = {"name": "g", "namespace": "team-b", "uid": "pg", "resourceVersion": "1"}
    kind = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup"}
    group = {**kind, "metadata": meta, "spec": {"minMember": 2}}
    server.mirror.on_podgroups("SYNC", [group])
    gang = {"scheduling.x-k8s.io/pod-group": "g"}
    cpus = [{"name": "main", "image": "x", "resources": {"requests": {"cpu": "5"}}}]
    members = [manifest(f"m{i}", "team-b", gang, affinity=PROD_DB_AWAY, containers=cpus) for i in range(2)]
    server.mirror.on_pods("SYNC", [manifest("db", "team-a", {"app": "db"}, "n1"), *members])

    def passed() -> list[str]:
        answer = server.filter(orjson.dumps({"Pod": members[0], "NodeNames": ["n1", "n2"]}))
        return list(answer["NodeNames"])

    assert passed() == ["n1", "n2"]
    relabel(server, "team-a", {"tier": "prod"})
    assert passed() == []
    relabel(server, "team-a", {"tier": "dev"})
    assert passed() == ["n1", "n2"]
