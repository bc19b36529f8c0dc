"""The version-adaptive client on a real kube-apiserver 1.20.2: `kubegpu scheduler` asks the server its version and
which Events API it serves, shows both in `/readyz`, and writes its Events in the newest API served
(`events.k8s.io/v1`, as kube-scheduler 1.20 does), or in core `v1` on a server with that API turned off. The
discovery documents the unit tests use as 1.20.2's (`tests/fixtures/discovery/*-1.20.2.json`) are checked here
against the live server's answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .cluster import Cluster, running_cluster, wait_for
from .test_preemption import ready

FIXTURES = Path(__file__).parent.parent / "fixtures" / "discovery"
TOO_BIG = {"cpu": "1000"}  # no node has a thousand CPUs: the pod fits nowhere and gets a FailedScheduling Event


def unschedulable_pod(cluster: Cluster, namespace: str, scheduler: str, name: str = "too-big") -> None:
    container = {"name": "main", "image": "busybox", "resources": {"requests": TOO_BIG}}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"schedulerName": scheduler, "containers": [container]},
    }
    cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", body)


def failed_scheduling(cluster: Cluster, path: str) -> list[dict[str, Any]]:
    items, _ = cluster.client.list(path)
    return [e for e in items if e.get("reason") == "FailedScheduling"]


def recorded(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def test_the_recorded_1_20_2_documents_are_what_the_server_answers(cluster: Cluster) -> None:
    assert cluster.client.get("/apis/events.k8s.io") == recorded("events.k8s.io-1.20.2.json")
    # The test binaries are built from the v1.20.2 tag (scripts/k8s-binaries.sh): the build's date and Go differ
    # from one build to the next, the release and its commit do not.
    live, kept = cluster.client.get("/version"), recorded("version-1.20.2.json")
    release = ("major", "minor", "gitVersion", "gitCommit")
    assert (set(live), [live[k] for k in release]) == (set(kept), [kept[k] for k in release])


def test_events_are_written_as_events_k8s_io_v1_and_readyz_shows_the_server(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    cluster.create_ready_node("small-1", allocatable={"cpu": "4"})
    scheduler = start_scheduler("kubegpu-versions")
    body = ready(scheduler)
    assert body["kubernetes"] == "v1.20.2"
    assert body["apis"]["events"] == "events.k8s.io/v1"
    assert body["apis"]["leases"] == "coordination.k8s.io/v1"  # it elects a leader: the Leases' API is looked for
    assert "warnings" not in body
    assert not [m for m in body.get("missing", []) if "events" in m or "leases" in m]  # (podgroups: no CRD here)
    scheduler.wait_logged("Events written as events.k8s.io/v1")

    unschedulable_pod(cluster, namespace, "kubegpu-versions")
    path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
    (event, *_) = wait_for(lambda: failed_scheduling(cluster, path), 30, "a FailedScheduling event")
    assert event["reportingController"] == "kubegpu-versions"
    assert event["action"] == "Scheduling"
    assert event["regarding"]["name"] == "too-big"
    assert "Insufficient cpu" in event["note"]
    # The same Event through core/v1, where `kubegpu top` and `kubectl describe` read it.
    (legacy, *_) = failed_scheduling(cluster, f"/api/v1/namespaces/{namespace}/events")
    assert legacy["involvedObject"]["name"] == "too-big" and legacy["message"] == event["note"]


def test_a_pod_of_a_long_name_gets_its_events_k8s_io_v1_event(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    # A valid 250-character name whose 236th character is '-': the Event, named after the first 236 characters and
    # ".<time>", was refused by the server (not a DNS subdomain), so the pod's owner never saw why it waits.
    name = "a" * 235 + "-" + "b" * 14
    cluster.create_ready_node("small-2", allocatable={"cpu": "4"})
    start_scheduler("kubegpu-long-names")
    unschedulable_pod(cluster, namespace, "kubegpu-long-names", name)
    path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
    (event, *_) = wait_for(lambda: failed_scheduling(cluster, path), 30, "a FailedScheduling event")
    assert event["regarding"]["name"] == name and "Insufficient cpu" in event["note"]


def test_a_server_with_events_k8s_io_turned_off_gets_core_v1_events(start_scheduler: Any, tmp_path: Path) -> None:
    with running_cluster(tmp_path / "k8s", "--runtime-config=events.k8s.io/v1=false") as bare:
        namespace = bare.create_namespace("core-events")
        bare.create_ready_node("small-2", allocatable={"cpu": "4"})
        scheduler = start_scheduler("kubegpu-core-events", "--no-leader-elect", kubeconfig=bare.kubeconfig)
        body = ready(scheduler)
        assert body["apis"]["events"] == "v1"
        unschedulable_pod(bare, namespace, "kubegpu-core-events")
        path = f"/api/v1/namespaces/{namespace}/events"
        (event, *_) = wait_for(lambda: failed_scheduling(bare, path), 30, "a FailedScheduling event")
        assert event["source"]["component"] == "kubegpu-core-events"
        assert "Insufficient cpu" in event["message"]
