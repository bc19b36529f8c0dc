"""The custom scheduler reads PersistentVolumeClaims and PersistentVolumes from its informers (VolumeBinding).

As in test_service_guards.py, the scheduler runs without a cluster: informer events are handed to its mirror
directly and the writer records the Events and Bindings it would have written. Each test is what an operator sees:
a pod goes where its volume is, waits with a reason naming its claim, and is placed once the claim is bound.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.scheduler import objects, queue
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.mirror import DRA_KINDS, OWNER_PATHS

from .test_service_guards import KEY, RecordingWriter, errors, schedule_all

HOST = "kubernetes.io/hostname"


@pytest.fixture
def service() -> CustomScheduler:
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), signing_key=KEY)
    svc = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    svc.mirror.on_nodes("SYNC", [node_manifest(n, labels={HOST: n}) for n in ("n1", "n2", "n3")])
    svc.mirror.on_namespaces("SYNC", [])
    for kind in OWNER_PATHS:  # no Service, ReplicaSet, ...: readiness waits only for what each test leaves out
        svc.mirror.on_owners(kind, "SYNC", [])
    svc.mirror.on_budgets("SYNC", [])
    svc.mirror.on_podgroups("SYNC", [])
    for kind in DRA_KINDS:
        svc.mirror.on_dra(kind, "SYNC", [])
    return svc


def writer(service: CustomScheduler) -> RecordingWriter:
    return service.binder.writer  # type: ignore[return-value]


def claim(name: str, volume: str = "", phase: str = "Pending", namespace: str = "default") -> dict[str, Any]:
    spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    if volume:
        spec["volumeName"] = volume
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
        "spec": spec,
        "status": {"phase": phase},
    }


def volume(name: str, node: str | None = None, operator: str = "In") -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}
    if node is not None:
        term = {"matchExpressions": [{"key": HOST, "operator": operator, "values": [node]}]}
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [term]}}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


def pod(name: str, *claims: str) -> dict[str, Any]:
    manifest = pod_manifest(name, scheduler_name="kubegpu")
    manifest["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
    manifest["spec"]["volumes"] = [{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims]
    return manifest


def bound_to(service: CustomScheduler) -> dict[str, str]:
    return {b["metadata"]["name"]: b["target"]["name"] for m, p, b in writer(service).writes if p.endswith("/binding")}


def refusals(service: CustomScheduler, name: str) -> list[str]:
    return [e["message"] for e in writer(service).events("FailedScheduling") if e["involvedObject"]["name"] == name]


def sync(service: CustomScheduler, claims: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> None:
    service.mirror.on_claims("SYNC", claims)
    service.mirror.on_volumes("SYNC", volumes)


def test_a_pod_goes_to_the_node_its_bound_volume_is_on(service: CustomScheduler) -> None:
    sync(service, [claim("data", "pv-data", "Bound")], [volume("pv-data", "n2")])
    service.mirror.on_pods("SYNC", [pod("db", "data")])
    schedule_all(service)
    assert bound_to(service) == {"db": "n2"}


def test_a_volume_any_node_can_reach_leaves_the_choice_to_the_scores(service: CustomScheduler) -> None:
    sync(service, [claim("shared", "pv-nfs", "Bound")], [volume("pv-nfs")])
    service.mirror.on_pods("SYNC", [pod("web", "shared")])
    schedule_all(service)
    assert set(bound_to(service)) == {"web"}


def backoff_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue's clock moved past any pod's backoff."""
    later = time.monotonic() + queue.MAX_BACKOFF
    monkeypatch.setattr(queue.time, "monotonic", lambda: later)


def test_a_pod_with_an_unbound_claim_waits_and_is_placed_once_it_is_bound(
    service: CustomScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync(service, [claim("data")], [])
    service.mirror.on_pods("SYNC", [pod("db", "data")])
    schedule_all(service)
    assert bound_to(service) == {}
    [message] = refusals(service, "db")
    assert "unbound immediate PersistentVolumeClaims" in message and "'data'" in message
    assert "default/db" in service.queue.unschedulable
    # The volume appears and the claim is bound to it (the PV controller's two writes): the pod is woken.
    service.mirror.on_volumes("ADDED", volume("pv-data", "n3"))
    service.mirror.on_claims("MODIFIED", claim("data", "pv-data", "Bound"))
    assert "default/db" not in service.queue.unschedulable
    backoff_over(monkeypatch)
    service.queue.promote()
    schedule_all(service)
    assert bound_to(service) == {"db": "n3"}


def test_a_claim_bound_to_a_volume_on_no_node_the_pod_may_use_refuses_every_node(service: CustomScheduler) -> None:
    sync(service, [claim("data", "pv-gone", "Bound")], [volume("pv-gone", "elsewhere")])
    service.mirror.on_pods("SYNC", [pod("db", "data")])
    schedule_all(service)
    [message] = refusals(service, "db")
    assert message == "0/3 nodes are available: 3 node(s) had volume node affinity conflict."


def test_a_claim_that_is_not_yet_phase_bound_is_unbound(service: CustomScheduler) -> None:
    sync(service, [claim("data", "pv-data", "Pending")], [volume("pv-data", "n1")])
    service.mirror.on_pods("SYNC", [pod("db", "data")])
    schedule_all(service)
    assert bound_to(service) == {} and "'data'" in refusals(service, "db")[0]


def test_deleted_claims_and_volumes_and_those_a_relist_misses_are_forgotten(service: CustomScheduler) -> None:
    sync(service, [claim("a", "pv-a", "Bound"), claim("b", "pv-b", "Bound")], [volume("pv-a"), volume("pv-b")])
    service.mirror.on_claims("DELETED", claim("a", "pv-a", "Bound"))
    service.mirror.on_volumes("SYNC", [volume("pv-a")])  # pv-b went while the watch was down
    service.mirror.on_pods("SYNC", [pod("uses-a", "a"), pod("uses-b", "b")])
    schedule_all(service)
    assert bound_to(service) == {}
    assert refusals(service, "uses-a") == ['0/3 nodes are available: 3 persistentvolumeclaim "a" not found.']
    assert refusals(service, "uses-b") == ["0/3 nodes are available: 3 pvc(s) bound to non-existent pv(s)."]


def test_a_bound_claim_being_deleted_refuses_its_pods_as_kube_scheduler_1_20_does(service: CustomScheduler) -> None:
    """kube-scheduler 1.20's VolumeBinding PreFilter refuses a pod whose claim has a deletionTimestamp, bound or
    not (the claim is kept by its finalizer while a pod uses it); the claim's deletion finishing leaves it not found."""
    deleting = claim("data", "pv-data", "Bound")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    sync(service, [deleting], [volume("pv-data", "n1")])
    service.mirror.on_pods("SYNC", [pod("db", "data")])
    schedule_all(service)
    assert bound_to(service) == {}
    assert refusals(service, "db") == ['0/3 nodes are available: 3 persistentvolumeclaim "data" is being deleted.']


def test_malformed_claims_and_volumes_cost_only_the_pods_that_name_them(
    service: CustomScheduler, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken_claim = claim("broken", "pv-ok", "Bound")
    broken_claim["spec"]["volumeName"] = ["not", "a", "name"]
    broken_volume = volume("pv-broken", "n1", operator="Near")
    sync(
        service,
        [broken_claim, claim("ok", "pv-ok", "Bound"), claim("on-broken", "pv-broken", "Bound")],
        [volume("pv-ok", "n1"), broken_volume],
    )
    assert service.mirror.ready() is False  # pods not listed yet
    service.mirror.on_pods("SYNC", [pod("a", "broken"), pod("b", "on-broken"), pod("c", "ok")])
    assert service.mirror.ready()
    schedule_all(service)
    assert bound_to(service) == {"c": "n1"}
    assert refusals(service, "a") == ['0/3 nodes are available: 3 persistentvolumeclaim "broken" not found.']
    assert refusals(service, "b") == ["0/3 nodes are available: 3 pvc(s) bound to non-existent pv(s)."]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("PersistentVolumeClaim default/broken ignored: " in w and "volumeName" in w for w in warnings)
    assert any("PersistentVolume pv-broken ignored: " in w and "operator" in w for w in warnings)
    # A claim fixed by its owner counts again.
    service.mirror.on_claims("MODIFIED", claim("broken", "pv-ok", "Bound"))
    backoff_over(monkeypatch)
    service.queue.promote()
    schedule_all(service)
    assert bound_to(service)["a"] == "n1"


def test_a_claim_whose_handling_raises_is_skipped_without_a_pod_event(
    service: CustomScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = objects.claim

    def exploding(document: Any) -> Any:
        if document["metadata"]["name"] == "cursed":
            raise RuntimeError("boom")
        return original(document)

    monkeypatch.setattr(objects, "claim", exploding)
    sync(service, [claim("cursed", "pv", "Bound"), claim("fine", "pv", "Bound")], [volume("pv", "n2")])
    assert service.mirror.claims_synced.is_set()
    assert errors(service, "claim_event") == 1
    service.mirror.on_pods("SYNC", [pod("p", "fine")])
    schedule_all(service)
    assert bound_to(service) == {"p": "n2"}
    assert writer(service).events("KubegpuInternalError") == []  # no Event on a pod named like the claim


def test_readiness_waits_for_the_first_list_of_claims_and_of_volumes(service: CustomScheduler) -> None:
    service.mirror.on_pods("SYNC", [])
    assert not service.mirror.ready()
    service.mirror.on_claims("SYNC", [])
    assert not service.mirror.ready()
    service.mirror.on_volumes("SYNC", [])
    assert service.mirror.ready()


def test_the_extender_leaves_volumes_to_kube_scheduler() -> None:
    """kube-scheduler runs VolumeBinding before it asks the extender, and binds the claims that wait for their first
    consumer; the extender, which would refuse those, neither watches claims nor judges them."""
    from kubegpu.scheduler.extender import ExtenderServer

    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False))
    server = ExtenderServer(engine, None, None)  # type: ignore[arg-type]
    assert not server.mirror.watch_volumes and not engine.track_volumes
    server.mirror.on_nodes("SYNC", [node_manifest("n1")])
    server.mirror.on_namespaces("SYNC", [])
    server.mirror.on_pods("SYNC", [])
    server.mirror.on_podgroups("SYNC", [])  # the gangs it answers for
    server.mirror.on_budgets("SYNC", [])  # the budgets `/preempt` counts
    assert server.mirror.ready()
