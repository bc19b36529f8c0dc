"""The custom scheduler reads Services, ReplicationControllers, ReplicaSets and StatefulSets from its informers, so
the replicas they select spread over zones and hosts as kube-scheduler 1.20 spreads them (PodTopologySpread's default
constraints).

As in test_live_volumes.py, the scheduler runs without a cluster: informer events are handed to its mirror directly
and the writer records the Bindings it would have written.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.scheduler.config import parse_config
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.mirror import DRA_KINDS

from .test_service_guards import KEY, RecordingWriter, errors, schedule_all

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
NODES = [f"{zone}{i}" for zone in "abc" for i in (1, 2)]


def start(profile: Any = None) -> CustomScheduler:
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), signing_key=KEY, scoring=profile)
    svc = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    nodes = [node_manifest(n, labels={HOST: n, ZONE: f"zone-{n[0]}"}, cpu="8", memory="32Gi") for n in NODES]
    svc.mirror.on_nodes("SYNC", nodes)
    svc.mirror.on_namespaces("SYNC", [])
    svc.mirror.on_budgets("SYNC", [])  # no PodDisruptionBudget: readiness waits only for what each test leaves out
    svc.mirror.on_podgroups("SYNC", [])
    for kind in DRA_KINDS:
        svc.mirror.on_dra(kind, "SYNC", [])
    return svc


@pytest.fixture
def service() -> CustomScheduler:
    return start()


def replica(name: str, app: str = "web") -> dict[str, Any]:
    manifest = pod_manifest(name, scheduler_name="kubegpu", namespace="shop")
    manifest["metadata"].update(uid=f"uid-{name}", resourceVersion="1", labels={"app": app})
    manifest["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "500m", "memory": "2Gi"}}
    return manifest


def owner(kind: str, name: str, selector: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "shop", "resourceVersion": "1"}, "spec": {"selector": selector}}


def sync_owners(service: CustomScheduler, **found: list[dict[str, Any]]) -> None:
    for kind in ("Service", "ReplicationController", "ReplicaSet", "StatefulSet"):
        service.mirror.on_owners(kind, "SYNC", found.get(kind, []))


def placed(service: CustomScheduler) -> list[str]:
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    return [body["target"]["name"] for _, path, body in writer.writes if path.endswith("/binding")]


def run(service: CustomScheduler, count: int, app: str = "web") -> list[str]:
    service.mirror.on_pods("SYNC", [replica(f"{app}-{i}", app) for i in range(count)])
    schedule_all(service)
    return placed(service)


def sync_the_rest(service: CustomScheduler) -> None:
    """The first lists of pods, claims and volumes, which scheduling waits for too."""
    service.mirror.on_pods("SYNC", [])
    service.mirror.on_claims("SYNC", [])
    service.mirror.on_volumes("SYNC", [])


def test_scheduling_waits_for_every_owner_kinds_first_list(service: CustomScheduler) -> None:
    sync_the_rest(service)
    assert not service.mirror.ready()
    for kind in ("Service", "ReplicationController", "ReplicaSet"):
        service.mirror.on_owners(kind, "SYNC", [])
    assert not service.mirror.ready()
    service.mirror.on_owners("StatefulSet", "SYNC", [])
    assert service.mirror.ready()


def test_replicas_a_service_selects_spread_over_zones_and_hosts(service: CustomScheduler) -> None:
    sync_owners(service, Service=[owner("Service", "web", {"app": "web"})])
    nodes = run(service, 6)
    assert sorted(nodes) == sorted(NODES)
    assert sorted(n[0] for n in nodes[:3]) == ["a", "b", "c"]


def test_without_an_owner_the_same_replicas_follow_binpack(service: CustomScheduler) -> None:
    sync_owners(service, Service=[owner("Service", "db", {"app": "db"})])
    assert run(service, 4) == ["a1"] * 4


def test_an_owner_added_deleted_or_gone_at_a_relist_changes_the_next_placements(service: CustomScheduler) -> None:
    sync_owners(service)
    service.mirror.on_owners("ReplicaSet", "ADDED", owner("ReplicaSet", "web-5d8f", {"matchLabels": {"app": "web"}}))
    assert service.engine.owner_keys() == [("ReplicaSet", "shop", "web-5d8f")]
    assert len(set(run(service, 2))) == 2
    service.mirror.on_owners("ReplicaSet", "DELETED", owner("ReplicaSet", "web-5d8f", None))
    assert service.engine.owner_keys() == []
    service.mirror.on_owners("StatefulSet", "ADDED", owner("StatefulSet", "web", {"matchLabels": {"app": "web"}}))
    service.mirror.on_owners("StatefulSet", "SYNC", [])  # a relist that no longer finds it
    assert service.engine.owner_keys() == []


def test_an_unreadable_or_raising_owner_costs_only_itself(
    service: CustomScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = service.mirror._apply_owner

    def exploding(kind: str, event: str, obj: dict[str, Any]) -> bool:
        if obj["metadata"]["name"] == "cursed":
            raise RuntimeError("boom")
        return original(kind, event, obj)

    monkeypatch.setattr(service.mirror, "_apply_owner", exploding)
    bad_selector = owner("ReplicaSet", "broken", {"matchExpressions": [{"key": "app", "operator": "In"}]})
    good = owner("Service", "web", {"app": "web"})
    service.mirror.on_owners("Service", "SYNC", [owner("Service", "cursed", {"app": "web"}), good])
    service.mirror.on_owners("ReplicaSet", "SYNC", [bad_selector])
    assert errors(service, "owner_event") == 1
    assert service.engine.owner_keys() == [("Service", "shop", "web")]  # the broken one selects nothing
    service.mirror.on_owners("ReplicationController", "SYNC", [])
    service.mirror.on_owners("StatefulSet", "SYNC", [])
    assert len(set(run(service, 3))) == 3  # the Service still spreads its pods


def test_with_the_defaults_turned_off_no_owner_is_watched_or_waited_for() -> None:
    document = {
        "apiVersion": "kubescheduler.config.k8s.io/v1beta1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"pluginConfig": [{"name": "PodTopologySpread", "args": {"defaultingType": "List"}}]}],
    }
    service = start(parse_config(document).profile)
    assert service.mirror.owners_synced == {}
    sync_the_rest(service)
    assert service.mirror.ready()
    assert run(service, 3) == ["a1"] * 3
