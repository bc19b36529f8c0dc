"""Scheduling gates (`spec.schedulingGates`, Kubernetes 1.26+, GA 1.30): Kueue creates pods gated and lifts the gates
once quota admits them. A gated pod waits outside the queue, tried by no cycle, and is shown as gated with its gate
names by `/metrics`, `kubegpu top` and `kubegpu simulate`; the update that removes its last gate schedules it.

The 1.20.2 API server the integration tests run prunes `schedulingGates` (it does not know the field), so these
tests feed the decoder, the mirror and the queue pods in the exact shape of upstream's core/v1 types
(`PodSpec.SchedulingGates []PodSchedulingGate`, each `{"name": ...}`), as a 1.30+ API server sends them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.cli import main
from kubegpu.core.manifests import ManifestError, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.gates import CONDITION_MESSAGE, gated_reason
from kubegpu.scheduler.top import ClusterView

from .test_service_guards import RecordingWriter, cpu_node_service, schedule_all

GATES = ["kueue.x-k8s.io/admission", "example.com/quota"]


def gated(name: str, gates: list[str] = GATES, **kwargs: Any) -> dict[str, Any]:
    manifest = pod_manifest(name, {"main": {"cpu": "1"}}, scheduler_name="kubegpu", **kwargs)
    manifest["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
    manifest["spec"]["schedulingGates"] = [{"name": gate} for gate in gates]
    if gates:  # what a 1.30 API server gives a pod created with gates
        condition = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
        manifest["status"] = {"phase": "Pending", "conditions": [{**condition, "message": CONDITION_MESSAGE}]}
    return manifest


def test_the_decoder_reads_the_gate_names_and_refuses_a_gate_without_one() -> None:
    request, _ = pod_request(gated("p"))
    assert request.scheduling_gates == tuple(GATES)
    assert pod_request(gated("q", []))[0].scheduling_gates == ()
    manifest = gated("r")
    manifest["spec"]["schedulingGates"] = [{}]
    with pytest.raises(ManifestError, match=r"Pod.spec.schedulingGates\[0\].name"):
        pod_request(manifest)


@pytest.fixture
def service() -> CustomScheduler:
    svc = cpu_node_service()
    return svc


def bindings(service: CustomScheduler) -> list[str]:
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    return [path.split("/")[-2] for method, path, _ in writer.writes if path.endswith("/binding")]


def gauge(service: CustomScheduler) -> float:
    return service.metrics.registry.get_sample_value("kubegpu_scheduler_pending_pods", {"queue": "gated"}) or 0.0


def test_a_gated_pod_waits_outside_the_queue_and_is_scheduled_once_its_last_gate_is_removed(
    service: CustomScheduler,
) -> None:
    service.mirror.on_pods("ADDED", gated("job-0"))
    schedule_all(service)
    assert bindings(service) == []  # kubegpu bound gated pods before
    assert "default/job-0" not in service.queue.active and gauge(service) == 1.0

    service.mirror.on_pods("MODIFIED", gated("job-0", GATES[1:]))  # one gate lifted, one left
    schedule_all(service)
    assert bindings(service) == [] and gauge(service) == 1.0

    service.mirror.on_pods("MODIFIED", gated("job-0", []))  # Kueue admitted it
    schedule_all(service)
    assert bindings(service) == ["job-0"]
    assert gauge(service) == 0.0


def test_a_gated_pod_deleted_or_gone_at_a_relist_is_no_longer_counted(service: CustomScheduler) -> None:
    service.mirror.on_pods("ADDED", gated("a"))
    service.mirror.on_pods("ADDED", gated("b"))
    assert gauge(service) == 2.0
    service.mirror.on_pods("DELETED", gated("a"))
    assert gauge(service) == 1.0
    service.mirror.on_pods("SYNC", [])
    assert gauge(service) == 0.0


def test_a_gated_pod_of_another_scheduler_is_not_counted(service: CustomScheduler) -> None:
    service.mirror.on_pods("ADDED", {**gated("theirs"), "spec": {**gated("theirs")["spec"], "schedulerName": "x"}})
    assert gauge(service) == 0.0


def per_gate(service: CustomScheduler) -> dict[str, float]:
    """`kubegpu_scheduler_gated_pods{gate}` as /metrics serves it."""
    families = service.metrics.registry.collect()
    samples = [s for f in families if f.name == "kubegpu_scheduler_gated_pods" for s in f.samples]
    return {s.labels["gate"]: s.value for s in samples}


def test_metrics_name_the_gates_pods_wait_on(service: CustomScheduler) -> None:
    service.mirror.on_pods("ADDED", gated("job-0"))
    service.mirror.on_pods("ADDED", gated("job-1", GATES[:1]))
    assert per_gate(service) == {"kueue.x-k8s.io/admission": 2.0, "example.com/quota": 1.0}
    service.mirror.on_pods("MODIFIED", gated("job-0", GATES[1:]))  # Kueue admitted job-0; quota still holds it
    assert per_gate(service) == {"kueue.x-k8s.io/admission": 1.0, "example.com/quota": 1.0}
    service.mirror.on_pods("MODIFIED", gated("job-0", []))
    service.mirror.on_pods("DELETED", gated("job-1", GATES[:1]))
    assert per_gate(service) == {}, "a gate no pod waits on has no series"


def test_tenant_gate_names_cost_at_most_32_series_each_bounded_and_escaped(service: CustomScheduler) -> None:
    for i in range(40):
        service.mirror.on_pods("ADDED", gated(f"p{i}", [f"example.com/g{i}"]))
    service.mirror.on_pods("ADDED", gated("evil", ["evil\x1b[31m" + "x" * 5000]))
    found = per_gate(service)
    assert len(found) == 33 and found["(other)"] == 9.0
    assert all(len(label) <= 1024 and "\x1b" not in label for label in found)
    for i in range(40):
        service.mirror.on_pods("DELETED", gated(f"p{i}", [f"example.com/g{i}"]))
    service.mirror.on_pods("DELETED", gated("evil", []))
    assert per_gate(service) == {}


def test_kubegpu_top_shows_a_gated_pod_with_its_gate_names() -> None:
    view = ClusterView(make_plugin_manager("scheduler"), None)
    view.sync_pods([gated("job-0")])
    assert [(p.pod, p.reason) for p in view.report().pending] == [
        ("default/job-0", "SchedulingGated: waiting for scheduling gates: [kueue.x-k8s.io/admission example.com/quota]")
    ]
    view.apply_pod("MODIFIED", gated("job-0", []))
    assert view.report().pending[0].reason == "waiting for scheduler kubegpu (no FailedScheduling event yet)"


def test_the_shown_gates_are_bounded_and_escaped() -> None:
    reason = gated_reason([f"example.com/g{i}" for i in range(50)] + ["evil\x1b[31m"])
    assert reason.endswith("example.com/g7] and 43 more")
    assert "\x1b" not in gated_reason(["evil\x1b[31m"])


def test_kubegpu_simulate_shows_a_gated_pod_and_schedules_it_once_a_later_document_lifts_its_gates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all([node_manifest("n1", cpu="8"), gated("job-0"), gated("job-0", [])]))
    assert main(["simulate", "--json", str(path)]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [(e["event"], e["node"]) for e in events] == [("gated", None), ("scheduled", "n1")]
    assert events[0]["reason"] == gated_reason(GATES)

    path.write_text(yaml.safe_dump_all([node_manifest("n1", cpu="8"), gated("job-1")]))
    assert main(["simulate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "default/job-1" in out and "gated" in out
    assert "scheduled 0, unschedulable 0, gated 1, deleted 0" in out
