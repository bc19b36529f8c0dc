"""Pods of Kubernetes 1.33-1.35 carrying what kubegpu's decoder did not know: never a crash, never a node overcommitted.

A bound pod is counted on its node whatever else it says: where some field of its spec cannot be read (a value a
newer release added), what it holds (its containers' requests, overhead, pod-level resources, claims) is still
counted and only the unreadable field is left out, logged; a pending pod with such a field is refused, naming it.
Tolerations with the `Lt` and `Gt` operators (1.35, alpha: the TaintTolerationComparisonOperators gate) are read and
matched as kube-scheduler matches them (k8s.io/api core/v1 `Toleration.ToleratesTaint`, `compareNumericValues`).

The 1.20.2 API server of the live tests refuses both operators, so the pods are told to the mirror directly, in the
exact core/v1 shape a 1.35 API server sends.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kubegpu.core.manifests import ManifestError, pod_request
from kubegpu.core.models import Taint, Toleration
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.scheduler.custom import CustomScheduler

from .test_resized_pods import bindings, bound, pending, retry
from .test_service_guards import KEY, cpu_node_service, schedule_all

SLA = {"key": "sla", "value": "900", "effect": "NoSchedule"}


@pytest.fixture
def service() -> CustomScheduler:
    svc = cpu_node_service()
    svc.queue.initial_backoff = svc.queue.max_backoff = 0.0
    return svc


@pytest.mark.parametrize(
    ("operator", "value", "taint_value", "tolerated"),
    [
        pytest.param("Lt", "950", "900", True, id="lt-taint-below"),
        pytest.param("Lt", "900", "900", False, id="lt-equal"),
        pytest.param("Lt", "800", "900", False, id="lt-taint-above"),
        pytest.param("Gt", "800", "900", True, id="gt-taint-above"),
        pytest.param("Gt", "950", "900", False, id="gt-taint-below"),
        pytest.param("Gt", "-5", "0", True, id="negative"),
        pytest.param("Lt", "950", "0900", False, id="taint-leading-zero"),
        pytest.param("Lt", "+950", "900", False, id="plus-sign"),
        pytest.param("Lt", "950", "nine", False, id="taint-not-a-number"),
        pytest.param("Gt", "-9223372036854775808", "9223372036854775807", True, id="int64-bounds"),
        pytest.param("Lt", "9223372036854775808", "1", False, id="past-int64"),
    ],
)
def test_lt_and_gt_compare_the_values_as_upstream(operator: str, value: str, taint_value: str, tolerated: bool) -> None:
    toleration = Toleration(key="sla", operator=operator, value=value, effect="NoSchedule")
    assert toleration.tolerates(Taint("sla", taint_value, "NoSchedule")) is tolerated


def sla_node(name: str, value: str) -> dict[str, Any]:
    return node_manifest(name, cpu="8", taints=[{**SLA, "value": value}])


def test_a_pending_pod_tolerating_by_lt_goes_only_where_the_taint_is_below_its_value(service: CustomScheduler) -> None:
    """Nodes tainted `sla=900` and `sla=990`; a pod tolerating `sla Lt 950` binds to the first, never the second."""
    service.mirror.on_nodes("SYNC", [sla_node("n1", "990"), sla_node("n2", "900")])
    document = pending("picky", "1")
    document["spec"]["tolerations"] = [{"key": "sla", "operator": "Lt", "value": "950", "effect": "NoSchedule"}]
    service.mirror.on_pods("ADDED", document)
    schedule_all(service)
    writer = service.binder.writer
    targets = [body["target"]["name"] for _, path, body in writer.writes if path.endswith("/binding")]  # type: ignore[attr-defined]
    assert targets == ["n2"]


def test_a_bound_pod_with_a_field_kubegpu_cannot_read_still_holds_its_cpu(
    service: CustomScheduler, caplog: pytest.LogCaptureFixture
) -> None:
    """A 6-CPU pod bound to an 8-CPU node by another scheduler carries a toleration operator kubegpu does not know
    (here a made-up `Approx`, standing for whatever a later release adds): it was left out of the node's count, and a
    5-CPU pod was bound beside it, which the kubelet then refused (OutOfcpu). It is counted; the field is named."""
    running = bound("big", "6", "1")
    running["spec"]["tolerations"] = [{"key": "sla", "operator": "Approx", "value": "900", "effect": "NoSchedule"}]
    with caplog.at_level(logging.WARNING, logger="kubegpu"):
        service.mirror.on_pods("ADDED", running)
    service.mirror.on_pods("ADDED", pending("waiting", "5"))
    schedule_all(service)
    assert bindings(service) == []
    held = service.engine.placement("default/big")
    assert held is not None and held.request.cpu_milli == 6000
    assert any("spec.tolerations" in r.getMessage() for r in caplog.records)
    # Its owner deletes it: the node is free again and the waiting pod binds.
    service.mirror.on_pods("DELETED", running)
    retry(service)
    assert bindings(service) == ["waiting"]


def test_a_bound_pod_keeps_every_field_it_can_be_read_by(service: CustomScheduler) -> None:
    """Only the unreadable field is left out: the bound pod's anti-affinity still keeps a pod of its app away."""
    service.mirror.on_nodes("SYNC", [node_manifest("n1", cpu="8", labels={"zone": "a"})])
    running = bound("db", "1", "1")
    running["metadata"]["labels"] = {"app": "db"}
    running["spec"]["tolerations"] = [{"key": "sla", "operator": "Approx", "value": "1"}]
    running["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}
            ]
        }
    }
    service.mirror.on_pods("ADDED", running)
    second = pending("db-2", "1")
    second["metadata"]["labels"] = {"app": "db"}
    service.mirror.on_pods("ADDED", second)
    schedule_all(service)
    assert bindings(service) == []


def test_a_pending_pod_with_an_unreadable_field_is_refused_naming_it() -> None:
    document = pod_manifest("p", tolerations=[{"key": "k", "operator": "Approx", "value": "1"}])
    with pytest.raises(ManifestError, match=r"spec\.tolerations\[0\]\.operator"):
        pod_request(document)


def test_kubegpu_top_draws_the_devices_of_a_bound_pod_it_cannot_read_whole() -> None:
    """`kubegpu top` showed such a pod as 'not readable' and its devices free; they are drawn as held."""
    from .test_top_view import bound_pod, holders, view_of

    pod = bound_pod("odd", ["0", "1", "2", "3"])
    pod["spec"]["tolerations"] = [{"key": "sla", "operator": "Approx", "value": "1"}]
    view = view_of([pod], key=KEY)
    assert holders(view) == {str(i): ["default/odd"] for i in range(4)}
    assert view.report().problems == ()


def test_relabelling_a_bound_pod_kubegpu_cannot_read_whole_costs_two_reads_per_event(
    service: CustomScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its owner relabels such a pod in a loop (each relabel is read again, as kube-scheduler reads new labels): each
    event read the pod again per field of its spec (five reads here, eleven with every field set), where a readable pod
    costs one. After the first event, the fields found unreadable are left out at once: two reads per event (the
    failing whole read and one without them), and the pod is counted as before, its new labels included."""
    from kubegpu.core import manifests

    reads = []
    parse = manifests._parse

    def counted(model: Any, document: Any, what: str) -> Any:
        reads.append(what)
        return parse(model, document, what)

    monkeypatch.setattr(manifests, "_parse", counted)
    running = bound("big", "6", "1")
    running["spec"]["tolerations"] = [{"key": "sla", "operator": "Approx", "value": "900", "effect": "NoSchedule"}]
    running["spec"]["nodeSelector"] = {"disk": "ssd"}
    service.mirror.on_pods("ADDED", running)
    first = len(reads)
    for turn in range(5):
        running["metadata"]["labels"] = {"turn": str(turn)}
        service.mirror.on_pods("MODIFIED", running)
    assert (len(reads) - first) / 5 == 2, (first, len(reads))
    held = service.engine.placement("default/big")
    assert held is not None and held.request.cpu_milli == 6000
    assert held.request.labels == {"turn": "4"} and held.request.node_selector == {"disk": "ssd"}


def test_a_field_of_a_bound_pod_that_becomes_unreadable_is_still_found(service: CustomScheduler) -> None:
    """The fields left out the last time are tried first; a read that still fails without them finds the new one."""
    from kubegpu.core.manifests import bound_pod_request

    running = bound("big", "6", "1")
    running["spec"]["tolerations"] = [{"key": "sla", "operator": "Approx", "value": "900"}]
    running["spec"]["schedulingGates"] = [{"nope": 1}]
    request, _, dropped = bound_pod_request(running, None, ("spec.tolerations",))
    assert dropped == ("spec.schedulingGates", "spec.tolerations") and request.cpu_milli == 6000
