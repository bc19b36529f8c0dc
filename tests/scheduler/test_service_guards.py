"""The custom scheduler's loop boundaries: one object that raises, or that a tenant wrote badly, costs only itself.

The scheduler runs here without a cluster: informer events are handed to it directly and the asynchronous writer is
replaced by one that records what would have been written (Events, Bindings), so each test reads as what an operator
and a tenant would see.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import pytest

from kubegpu.core.annotations import ALLOCATION_KEY
from kubegpu.core.legacy_kubegpu import DEVICE_INFORMATION
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.process import LogfmtFormatter
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.core.text import MAX_TEXT_CHARS
from kubegpu.plugins.nvidia.scheduler import MODEL_ANNOTATION
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine

from . import toy_plugin as toy

KEY = b"k" * 32


class RecordingWriter:
    """Stands in for `AsyncKubeClient`: runs each submitted coroutine at once and records every write."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        asyncio.run(coroutine)

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        self.writes.append((method, path, body))
        return {}

    async def post(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body)

    async def patch(self, path: str, body: Any, *, strategic: bool = False) -> Any:
        return await self.request("PATCH", path, body)

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [b for m, p, b in self.writes if p.endswith("/events") and b["reason"] == reason]

    def bindings(self) -> list[str]:
        return [b["metadata"]["name"] for m, p, b in self.writes if p.endswith("/binding")]


def cpu_node_service(cpu: str = "8") -> CustomScheduler:
    """A custom scheduler without device plugins, fed directly (no API server): one node `n1` of `cpu` cores, its pods
    listed (none)."""
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), signing_key=KEY)
    svc = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    svc.mirror.on_nodes("SYNC", [node_manifest("n1", cpu=cpu)])
    svc.mirror.on_pods("SYNC", [])
    return svc


@pytest.fixture
def service() -> CustomScheduler:
    plugins = make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False)
    engine = Engine(plugins, signing_key=KEY)
    svc = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    node = node_manifest("n1", labels={"toy.example/cards": "2"}, allocatable={"toy.example/card": 2})
    svc.mirror.on_nodes("SYNC", [node])
    return svc


def pod(name: str, cards: int = 1, **meta: Any) -> dict[str, Any]:
    manifest = pod_manifest(name, {"main": {toy.RESOURCE: cards}}, scheduler_name="kubegpu")
    manifest["metadata"].update(uid=f"uid-{name}", resourceVersion="1", **meta)
    return manifest


def schedule_all(service: CustomScheduler) -> None:
    service.schedule_active(100)
    while not service.mirror.events.empty():  # binding results
        service.mirror.handle(service.mirror.events.get_nowait())


def errors(service: CustomScheduler, stage: str) -> float:
    value = service.metrics.registry.get_sample_value("kubegpu_scheduler_internal_errors_total", {"stage": stage})
    return value or 0.0


def test_a_pod_whose_cycle_raises_costs_only_itself(service: CustomScheduler, monkeypatch: Any) -> None:
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    original = service.engine.schedule

    def exploding(request: Any, **options: Any) -> Any:
        if request.name == "cursed":
            raise RuntimeError("boom")
        return original(request, **options)

    monkeypatch.setattr(service.engine, "schedule", exploding)
    service.mirror.on_pods("SYNC", [pod("cursed"), pod("fine")])
    schedule_all(service)
    assert writer.bindings() == ["fine"]
    assert errors(service, "schedule") == 1
    [event] = writer.events("KubegpuInternalError")
    assert event["involvedObject"]["name"] == "cursed" and "RuntimeError('boom')" in event["message"]
    assert any(entry.key == "default/cursed" for entry in service.queue.backoff), "retried later, not dropped"


def test_a_pod_event_that_raises_skips_that_pod_and_the_sync_goes_on(
    service: CustomScheduler, monkeypatch: Any
) -> None:
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    original = service.mirror._apply_pod

    def exploding(kind: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == "cursed":
            raise KeyError("surprise")
        original(kind, obj)

    monkeypatch.setattr(service.mirror, "_apply_pod", exploding)
    service.mirror.on_pods("SYNC", [pod("cursed"), pod("fine")])
    assert service.mirror.pods_synced.is_set()
    schedule_all(service)
    assert writer.bindings() == ["fine"]
    assert errors(service, "pod_event") == 1
    assert [e["involvedObject"]["name"] for e in writer.events("KubegpuInternalError")] == ["cursed"]


def test_a_refused_allocation_is_reported_once_and_holds_nothing(service: CustomScheduler) -> None:
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    claim = '{"version":1,"node":"n1","podUID":"uid-squatter","containers":{"main":{"toy.example/card":["0","1"]}}}'
    squatter = pod("squatter", cards=0, annotations={ALLOCATION_KEY: claim})
    squatter["spec"]["nodeName"] = "n1"
    service.mirror.on_pods("SYNC", [squatter])
    for version in ("2", "3"):
        squatter["metadata"]["resourceVersion"] = version
        service.mirror.on_pods("MODIFIED", squatter)
    [event] = writer.events("AllocationRefused")
    assert "signature does not verify" in event["message"]
    service.mirror.on_pods("ADDED", pod("honest", cards=2))
    schedule_all(service)
    assert writer.bindings() == ["honest"]


def test_an_unreadable_pod_gets_one_event_naming_the_field(service: CustomScheduler) -> None:
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    huge = pod("huge")
    huge["spec"]["containers"][0]["resources"]["limits"][toy.RESOURCE] = "1e600000"
    service.mirror.on_pods("ADDED", huge)
    service.mirror.on_pods("MODIFIED", huge)
    service.mirror.on_pods("ADDED", pod("fine"))
    schedule_all(service)
    [event] = writer.events("FailedScheduling")
    assert event["involvedObject"]["name"] == "huge" and toy.RESOURCE in event["message"]
    assert writer.bindings() == ["fine"]


KUBEGPU_ASKS_ONE = {DEVICE_INFORMATION: '{"runningcontainer": {"main": {"requests": {"alpha.gpu/numgpu": 1}}}}'}


def test_another_schedulers_pod_written_for_microsoft_kubegpu_costs_nothing_and_ours_is_told_once(
    service: CustomScheduler, caplog: pytest.LogCaptureFixture
) -> None:
    # A DLWorkspace job still scheduled by KubeGPU's own scheduler keeps its `pod.alpha/DeviceInformation`
    # annotation: every status update of it logged "pod ignored" at error level in kubegpu's log. Ours with the same
    # annotation is refused, once, however often it changes.
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    caplog.set_level(logging.DEBUG, logger="kubegpu")
    theirs = pod("theirs", annotations=KUBEGPU_ASKS_ONE)
    theirs["spec"]["schedulerName"] = "kubegpu-legacy"
    ours = pod("ours", annotations=KUBEGPU_ASKS_ONE)
    service.mirror.on_pods("SYNC", [theirs, ours])
    for version in ("2", "3", "4"):
        for manifest in (theirs, ours):
            manifest["metadata"]["resourceVersion"] = version
            service.mirror.on_pods("MODIFIED", manifest)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.getMessage()[:12], getattr(r, "pod", None)) for r in errors] == [("pod ignored:", "default/ours")]
    [event] = writer.events("FailedScheduling")
    assert event["involvedObject"]["name"] == "ours" and "alpha.gpu" not in event["message"]
    assert "set resources.limits nvidia.com/gpu: 1" in event["message"]
    assert "default/theirs" not in service.mirror._refused, "nothing remembered of a pod we never schedule"


def test_a_pending_pod_edited_into_one_kubegpu_cannot_read_leaves_the_queue_and_is_told_why(
    service: CustomScheduler,
) -> None:
    # `job` was read and queued; before its turn its owner annotated it for Microsoft KubeGPU (a request kubegpu
    # cannot read). Its readable version stayed queued and was bound, with a card, from what it said before.
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]

    def job(version: int, **annotations: str) -> dict[str, Any]:
        manifest = pod("job", annotations=annotations)
        manifest["metadata"]["resourceVersion"] = str(version)
        return manifest

    service.mirror.on_pods("SYNC", [job(1)])
    service.mirror.on_pods("MODIFIED", job(2, **KUBEGPU_ASKS_ONE))
    schedule_all(service)
    assert writer.bindings() == []
    [event] = writer.events("FailedScheduling")
    assert event["involvedObject"]["name"] == "job" and DEVICE_INFORMATION in event["message"]
    assert "default/job" not in service.queue.active and len(service.queue.backoff) == 0
    # Fixed, then annotated again before its turn: told again, and still not placed from its readable version.
    service.mirror.on_pods("MODIFIED", job(3))
    service.mirror.on_pods("MODIFIED", job(4, **KUBEGPU_ASKS_ONE))
    schedule_all(service)
    assert writer.bindings() == [] and len(writer.events("FailedScheduling")) == 2
    service.mirror.on_pods("MODIFIED", job(5))
    schedule_all(service)
    assert writer.bindings() == ["job"]


def test_an_edit_from_before_the_binding_reported_after_it_keeps_the_pods_devices(service: CustomScheduler) -> None:
    # `job` was bound; the watch then reports an edit its owner made just before (pending still, relabelled and
    # annotated for Microsoft KubeGPU), before the Binding's own event. The pod is bound: it keeps its card, and is
    # told nothing.
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    service.mirror.on_pods("SYNC", [pod("job")])
    schedule_all(service)
    assert writer.bindings() == ["job"]
    late = pod("job", annotations=KUBEGPU_ASKS_ONE, labels={"team": "b"})
    late["metadata"]["resourceVersion"] = "2"
    service.mirror.on_pods("MODIFIED", late)
    assert service.engine.placement("default/job") is not None, "its card stays held"
    assert writer.events("FailedScheduling") == []


def test_a_tenants_200_kb_reason_is_logged_and_reported_bounded_and_escaped(caplog: pytest.LogCaptureFixture) -> None:
    # The nvidia plugin quotes the model a pod asks for in its refusal; the tenant writes 200 KB with a carriage
    # return that, printed raw, overwrites the line with a forged one, and terminal escapes.
    forged_line = '\rts=2021-01-01T00:00:00.000Z level=error logger=kubegpu msg="forged" \x1b[2J\x1b]52;c;aGk=\x07'
    model = ("A100" + forged_line + "m" * 1000) * 200
    engine = Engine(make_plugin_manager("scheduler"), signing_key=KEY)
    svc = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    svc.queue.initial_backoff = 0.0
    p4d = {"node.kubernetes.io/instance-type": "p4d.24xlarge"}
    svc.mirror.on_nodes("SYNC", [node_manifest("p4d-1", labels=p4d, allocatable={"nvidia.com/gpu": 8})])
    picky = pod_manifest("picky", {"main": {"nvidia.com/gpu": 1}}, scheduler_name="kubegpu")
    picky["metadata"].update(uid="uid-picky", resourceVersion="1", annotations={MODEL_ANNOTATION: model})
    svc.mirror.on_pods("SYNC", [picky])
    caplog.set_level(logging.INFO, logger="kubegpu")
    for _ in range(3):
        svc.queue.promote()
        schedule_all(svc)
        svc.queue.wake()

    lines = [LogfmtFormatter().format(r) for r in caplog.records if r.getMessage() == "unschedulable"]
    assert len(lines) == 3
    for line in lines:
        assert len(line) < 2 * MAX_TEXT_CHARS, f"a log line of {len(line)} characters"
        assert line.isprintable(), "a control character in a log line"
        assert '"A100\\\\rts=2021' in line  # the reason's escape, its backslash escaped by logfmt
    writer: RecordingWriter = svc.binder.writer  # type: ignore[assignment]
    [event] = writer.events("FailedScheduling")  # one Event: the reason did not change between attempts
    [condition] = [b["status"]["conditions"][0] for m, p, b in writer.writes if p.endswith("/status")]
    for message in (event["message"], condition["message"]):
        assert len(message) <= MAX_TEXT_CHARS and message.isprintable()
        assert message.startswith('0/1 nodes are available: 1 node(s) have no GPU of model "A100\\rts=2021')
        assert message.endswith(" more characters)")


def test_an_unreadable_pod_made_again_after_a_relist_is_told_again(service: CustomScheduler) -> None:
    # `huge` was deleted while the watch was down (the informer's relist, not a DELETED event, says it is gone), then
    # made again just as unreadable: the scheduler remembered having told the old pod and told the new one nothing,
    # so it waited without a word (the remembered reasons also grew with every such pod).
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    huge = pod("huge")
    huge["spec"]["containers"][0]["resources"]["limits"][toy.RESOURCE] = "1e600000"
    service.mirror.on_pods("ADDED", huge)
    service.mirror.on_pods("SYNC", [pod("fine")])  # relisted: `huge` is gone
    again = {**huge, "metadata": {**huge["metadata"], "uid": "uid-huge-2"}}
    service.mirror.on_pods("ADDED", again)
    events = writer.events("FailedScheduling")
    assert [e["involvedObject"]["uid"] for e in events] == ["uid-huge", "uid-huge-2"], events


def test_a_node_deleted_and_made_again_keeps_counting_the_pods_running_on_it(service: CustomScheduler) -> None:
    """A Node object deleted and registered again under its name (a kubelet re-registering, an operator's `kubectl
    delete node`): the pods bound there keep running and keep their devices, as kube-scheduler's cache keeps a
    deleted node's pods. Before: the re-created n1 looked empty until each pod's next event, and `late` was given the
    cards `holder` runs on."""
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    service.mirror.on_pods("ADDED", pod("holder", cards=2))
    schedule_all(service)
    assert writer.bindings() == ["holder"]
    running = pod("holder", cards=2)
    running["metadata"]["resourceVersion"] = "2"
    running["spec"]["nodeName"] = "n1"
    running["status"] = {"phase": "Running"}
    service.mirror.on_pods("MODIFIED", running)
    node = node_manifest("n1", labels={"toy.example/cards": "2"}, allocatable={"toy.example/card": 2})
    service.mirror.on_nodes("DELETED", node)
    service.mirror.on_nodes("ADDED", node)
    service.mirror.on_pods("ADDED", pod("late"))
    schedule_all(service)
    assert writer.bindings() == ["holder"], "late was given the cards holder runs on"
    assert service.engine.placement("default/holder") is not None


def test_a_pod_whose_node_comes_back_with_fewer_devices_is_still_counted_by_what_it_asks(
    service: CustomScheduler,
) -> None:
    """The Node of a running pod holding both cards is deleted and registered again with one card (a card lost while
    it was away): the pod's allocation no longer fits the node, but the pod still runs there. It is counted as the
    kubelet admits it, by the count it asks, so nothing is handed out from under it. Before: its allocation was
    refused ("card 1 does not exist"), the pod was counted nowhere, and `late` was bound to the card it runs on."""
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    service.mirror.on_pods("ADDED", pod("holder", cards=2))
    schedule_all(service)
    assert writer.bindings() == ["holder"]
    service.mirror.on_nodes(
        "DELETED", node_manifest("n1", labels={"toy.example/cards": "2"}, allocatable={"toy.example/card": 2})
    )
    service.mirror.on_nodes(
        "ADDED", node_manifest("n1", labels={"toy.example/cards": "1"}, allocatable={"toy.example/card": 1})
    )
    assert service.engine.placement("default/holder") is not None, "the running pod is counted nowhere"
    service.mirror.on_pods("ADDED", pod("late", cards=1))
    schedule_all(service)
    assert writer.bindings() == ["holder"], "late was given the card holder runs on"


def test_a_pod_deleted_while_its_node_is_gone_is_not_counted_when_the_node_comes_back(
    service: CustomScheduler,
) -> None:
    """The pod of a deleted Node leaves before the Node is made again: the node comes back empty, and the pod's
    record is not kept."""
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    service.mirror.on_pods("ADDED", pod("holder", cards=2))
    schedule_all(service)
    node = node_manifest("n1", labels={"toy.example/cards": "2"}, allocatable={"toy.example/card": 2})
    service.mirror.on_nodes("DELETED", node)
    gone = pod("holder", cards=2)
    gone["spec"]["nodeName"] = "n1"
    service.mirror.on_pods("DELETED", gone)
    service.mirror.on_nodes("ADDED", node)
    service.mirror.on_pods("ADDED", pod("late", cards=2))
    schedule_all(service)
    assert writer.bindings() == ["holder", "late"]
    assert service.mirror._orphans == {}
