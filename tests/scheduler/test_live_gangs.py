"""The custom scheduler with PodGroups, as the owner of a training job sees it: members held until the gang is
whole, then bound together; the PodGroup's status and Events; a malformed PodGroup refused to its own members only;
a gang that waits too long giving its places back; a cluster without the CRD still scheduling Kueue's gangs.

As in test_service_guards.py the scheduler runs without a cluster: informer events are handed to its mirror and the
writer records what it would have written, so that a test controls the clock and the order of events (victims
leaving one by one, a pod arriving between them). The stories on a real API server are
tests/integration/test_podgroups.py (PodGroup objects) and tests/integration/test_gangs.py (Kueue's labels).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.core.text import MAX_TEXT_CHARS
from kubegpu.kube.client import ApiError
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler import custom as custom_module
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.gangstatus import Counts, phase
from kubegpu.scheduler.health import answer_health
from kubegpu.scheduler.mirror import DRA_KINDS, OWNER_PATHS

from .test_service_guards import KEY, RecordingWriter

GPU = "nvidia.com/gpu"
RACK = "example.com/rack"
P5 = {"node.kubernetes.io/instance-type": "p5.48xlarge", "nvidia.com/gpu.count": "8"}


def node(name: str, rack: str) -> dict[str, Any]:
    return node_manifest(name, labels={**P5, RACK: rack}, allocatable={GPU: 8})


@pytest.fixture
def service() -> CustomScheduler:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), signing_key=KEY)
    engine.set_topology([RACK])
    svc = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    svc.mirror.on_nodes("SYNC", [node(f"{rack}-n{i}", rack) for rack in ("r1", "r2") for i in range(2)])
    svc.mirror.on_namespaces("SYNC", [])
    svc.mirror.on_pods("SYNC", [])
    svc.mirror.on_budgets("SYNC", [])
    svc.mirror.on_claims("SYNC", [])
    svc.mirror.on_volumes("SYNC", [])
    for kind in OWNER_PATHS:
        svc.mirror.on_owners(kind, "SYNC", [])
    for kind in DRA_KINDS:
        svc.mirror.on_dra(kind, "SYNC", [])
    return svc


def writer(service: CustomScheduler) -> RecordingWriter:
    return service.binder.writer  # type: ignore[return-value]


def podgroup(name: str, min_member: Any, timeout: int | None = None, uid: str = "pg-uid") -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    meta = {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": "1"}
    annotations = {"kueue.x-k8s.io/podset-required-topology": RACK}
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {**meta,
            "annotations": annotations}, "spec": spec}  # fmt: skip


def member(name: str, group: str, gpus: int = 8, **labels: str) -> dict[str, Any]:
    manifest = pod_manifest(name, {"main": {GPU: gpus}}, namespace="ml", scheduler_name="kubegpu")
    manifest["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
    manifest["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": group, **labels} if group else labels
    return manifest


def cycle(service: CustomScheduler) -> None:
    """One turn of the loop: the gangs' tick, the active pods, the binding results."""
    service._next_gang_tick = 0.0
    service.tend_gangs()
    service.queue.promote()
    service.schedule_active(100)
    while not service.mirror.events.empty():
        service.mirror.handle(service.mirror.events.get_nowait())


def bound_as_the_api_server_reports(service: CustomScheduler, name: str, gpus: int = 8) -> None:
    """The pod informer's report of a Binding the writer recorded (its node and annotations copied onto the pod)."""
    binding = next(b for _, p, b in writer(service).writes if p.endswith(f"/pods/{name}/binding"))
    obj = member(name, "train", gpus)
    obj["metadata"]["annotations"] = binding["metadata"].get("annotations", {})
    obj["metadata"]["resourceVersion"] = "2"
    obj["spec"]["nodeName"] = binding["target"]["name"]
    service.mirror.on_pods("MODIFIED", obj)


def status_patches(service: CustomScheduler, name: str) -> list[dict[str, Any]]:
    path = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups/{name}/status"
    return [b["status"] for m, p, b in writer(service).writes if m == "PATCH" and p == path]


def test_members_wait_at_permit_until_the_podgroup_is_whole_then_bind_in_one_rack_and_the_status_says_so(
    service: CustomScheduler,
) -> None:
    service.mirror.on_podgroups("SYNC", [podgroup("train", 3)])
    for name in ("train-0", "train-1"):
        service.mirror.on_pods("ADDED", member(name, "train", 4))
    cycle(service)
    assert writer(service).bindings() == [], "no member is bound before minMember have places"
    waiting = writer(service).events("WaitingForGang")
    assert {e["involvedObject"]["name"] for e in waiting} == {"train-0", "train-1"}
    assert "2 of minMember 3 members hold places" in waiting[0]["message"]
    assert "(up to 60s)" in waiting[0]["message"]

    service.mirror.on_pods("ADDED", member("train-2", "train", 4))
    cycle(service)
    assert sorted(writer(service).bindings()) == ["train-0", "train-1", "train-2"]
    racks = {service.engine.placement(f"ml/train-{i}").node.split("-")[0] for i in range(3)}  # type: ignore[union-attr]
    assert len(racks) == 1, racks

    for name in ("train-0", "train-1", "train-2"):
        bound_as_the_api_server_reports(service, name)
    cycle(service)
    last = status_patches(service, "train")[-1]
    assert last["phase"] == "Scheduled" and last["scheduled"] == 3 and last["running"] == 0, last
    assert "scheduleStartTime" in last
    (placed,) = writer(service).events("Scheduled")
    assert placed["involvedObject"] == {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "name": "train",
        "namespace": "ml",
        "uid": "pg-uid",
    }
    assert placed["type"] == "Normal" and placed["metadata"]["namespace"] == "ml"
    writes = len(writer(service).writes)
    cycle(service)
    assert len(writer(service).writes) == writes, "an unchanged status is not written again"


def test_a_malformed_podgroup_refuses_its_own_members_only_with_the_field_named(service: CustomScheduler) -> None:
    service.mirror.on_podgroups("SYNC", [podgroup("broken", -3), podgroup("fine", 1, uid="fine-uid")])
    service.mirror.on_pods("ADDED", member("broken-0", "broken", 1))
    service.mirror.on_pods("ADDED", member("fine-0", "fine", 1))
    service.mirror.on_pods("ADDED", member("plain", "", 1))
    cycle(service)
    assert sorted(writer(service).bindings()) == ["fine-0", "plain"]
    refused, on_group = writer(service).events("FailedScheduling")
    assert refused["involvedObject"]["name"] == "broken-0"
    assert on_group["involvedObject"]["kind"] == "PodGroup" and on_group["message"] == refused["message"]
    assert "PodGroup ml/broken cannot be read: PodGroup.spec.minMember: -3 is out of range" in refused["message"]

    service.mirror.on_podgroups("MODIFIED", podgroup("broken", 1))  # its owner fixes it: the member is woken
    waiting = service.queue.backoff.remove("ml/broken-0")
    assert waiting is not None, "woken by its PodGroup's change"
    waiting.ready_at = 0.0  # its backoff passed
    service.queue.backoff.push(waiting)
    cycle(service)
    assert "broken-0" in writer(service).bindings()


def test_a_tenants_oversized_podgroup_is_reported_bounded(service: CustomScheduler) -> None:
    service.mirror.on_podgroups("SYNC", [podgroup("huge", "\x1b[2J" + "9" * 200_000)])
    service.mirror.on_pods("ADDED", member("huge-0", "huge", 1))
    cycle(service)
    for refused in writer(service).events("FailedScheduling"):  # the member and its PodGroup
        assert len(refused["message"]) <= MAX_TEXT_CHARS and "\x1b" not in refused["message"]


def test_a_gang_waiting_past_its_timeout_gives_its_places_back_and_says_so(
    service: CustomScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    service.mirror.on_podgroups("SYNC", [podgroup("slow", 4, timeout=5)])
    for i in range(3):
        service.mirror.on_pods("ADDED", member(f"slow-{i}", "slow", 4))
    cycle(service)
    assert all(service.engine.placement(f"ml/slow-{i}") is not None for i in range(3)), "held at Permit"
    later = time.monotonic() + 6
    monkeypatch.setattr(custom_module.time, "monotonic", lambda: later)  # the scheduler's clock, 6 s on
    cycle(service)
    assert all(service.engine.placement(f"ml/slow-{i}") is None for i in range(3)), "places given back"
    timed_out = [e for e in writer(service).events("FailedScheduling") if "timed out" in e["message"]]
    assert {e["involvedObject"]["name"] for e in timed_out} == {"slow", "slow-0", "slow-1", "slow-2"}
    assert "timed out after 5s waiting at Permit: 3 of minMember 4 members held places" in timed_out[0]["message"]
    assert {e["involvedObject"]["kind"] for e in timed_out} == {"Pod", "PodGroup"}, "the PodGroup is told too"
    assert writer(service).bindings() == []


def test_a_second_gang_holds_nothing_while_the_first_is_partly_held(service: CustomScheduler) -> None:
    service.mirror.on_podgroups("SYNC", [podgroup("blue", 2), podgroup("green", 2, uid="g")])
    service.mirror.on_pods("ADDED", member("blue-0", "blue"))
    cycle(service)
    service.mirror.on_pods("ADDED", member("green-0", "green"))
    cycle(service)
    assert service.engine.placement("ml/blue-0") is not None
    assert service.engine.placement("ml/green-0") is None, "two gangs never both hold part"
    refused = {e["involvedObject"]["name"]: e["message"] for e in writer(service).events("FailedScheduling")}
    assert set(refused) == {"green-0", "green"}, "the member and its PodGroup are told"
    assert "gang ml/blue is partly held" in refused["green-0"]


def test_a_gang_that_fits_in_no_rack_holds_nothing_and_every_member_is_told_why(service: CustomScheduler) -> None:
    service.mirror.on_podgroups("SYNC", [podgroup("big", 3)])
    for i in range(3):
        service.mirror.on_pods("ADDED", member(f"big-{i}", "big"))
    cycle(service)
    assert writer(service).bindings() == []
    assert all(service.engine.placement(f"ml/big-{i}") is None for i in range(3))
    refused = writer(service).events("FailedScheduling")
    assert {e["involvedObject"]["name"] for e in refused if e["involvedObject"]["kind"] == "Pod"} == {
        "big-0",
        "big-1",
        "big-2",
    }
    assert "gang ml/big: 3 members need 8 nvidia.com/gpu each" in refused[0]["message"]


def report_bound(service: CustomScheduler, manifest: dict[str, Any]) -> dict[str, Any]:
    """The pod informer's report of a Binding the writer recorded for this pod."""
    name = manifest["metadata"]["name"]
    binding = next(b for _, p, b in writer(service).writes if p.endswith(f"/pods/{name}/binding"))
    manifest["metadata"]["annotations"] = binding["metadata"].get("annotations", {})
    manifest["metadata"]["resourceVersion"] = "2"
    manifest["spec"]["nodeName"] = binding["target"]["name"]
    service.mirror.on_pods("MODIFIED", manifest)
    return manifest


def test_a_rack_freed_for_a_preempting_gang_is_not_taken_by_pods_of_lower_priority_while_its_victims_leave(
    service: CustomScheduler,
) -> None:
    service.queue.initial_backoff = service.queue.max_backoff = 0.0
    service.mirror.server_version = (1, 31)  # where victims are marked DisruptionTarget (`--disruption-conditions`)
    fillers = []
    for i in range(4):
        filler = member(f"filler-{i}", "", 8)
        service.mirror.on_pods("ADDED", filler)
        fillers.append(filler)
    cycle(service)
    fillers = [report_bound(service, filler) for filler in fillers]
    service.mirror.on_podgroups("SYNC", [podgroup("urgent", 2)])
    for i in range(2):
        urgent = member(f"urgent-{i}", "urgent", 8)
        urgent["spec"]["priority"] = 1000
        service.mirror.on_pods("ADDED", urgent)
    cycle(service)
    evicted = [p.rsplit("/", 1)[1] for m, p, _ in writer(service).writes if m == "DELETE"]
    assert len(evicted) == 2, evicted
    marks = {  # each victim marked as kube-scheduler 1.26+ marks a preemption's, before its deletion
        p.rsplit("/", 2)[1]: b["status"]["conditions"][0]
        for m, p, b in writer(service).writes
        if m == "PATCH" and "DisruptionTarget" in str(b)
    }
    assert {name: (c["reason"], c["message"]) for name, c in marks.items()} == {
        name: ("PreemptionByScheduler", "kubegpu: preempting to accommodate a higher priority podgroup")
        for name in evicted
    }
    gone = {f["metadata"]["name"]: f for f in fillers}

    service.mirror.on_pods("DELETED", gone[evicted[0]])  # the first victim is gone; the second still leaving
    service.mirror.on_pods("ADDED", member("web", "", 8))  # an ordinary pod of lower priority arrives meanwhile
    cycle(service)
    cycle(service)
    assert "web" not in writer(service).bindings(), "the freed node is held for the gang"
    refused = [e["message"] for e in writer(service).events("FailedScheduling") if e["involvedObject"]["name"] == "web"]
    assert refused and "nominated for a pending pod" in refused[-1], refused

    service.mirror.on_pods("DELETED", gone[evicted[1]])
    cycle(service)
    cycle(service)
    assert {"urgent-0", "urgent-1"} <= set(writer(service).bindings())
    racks = {service.engine.placement(f"ml/urgent-{i}").node.split("-")[0] for i in range(2)}  # type: ignore[union-attr]
    assert racks == {gone[evicted[0]]["spec"]["nodeName"].split("-")[0]}
    assert not service.engine.nominated_gangs, "the hold ends when the gang is placed"


def test_a_gangs_victim_whose_deletion_failed_is_preempted_again(service: CustomScheduler) -> None:
    """A gang's victim whose deletion failed (a 500, a dropped connection) counted as leaving for as long as it ran:
    the gang waited for it and never preempted again. It is still there: the gang's next try deletes it again."""
    service.queue.initial_backoff = service.queue.max_backoff = 0.0
    fillers = [member(f"filler-{i}", "", 8) for i in range(4)]
    for filler in fillers:
        service.mirror.on_pods("ADDED", filler)
    cycle(service)
    for filler in fillers:
        report_bound(service, filler)
    refused: list[str] = []
    write = writer(service).request

    async def refusing(method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        if method == "DELETE" and not refused:
            refused.append(path.rsplit("/", 1)[1])
            raise ApiError(500, "InternalError", "etcdserver: request timed out")
        return await write(method, path, body, content_type)

    writer(service).request = refusing  # type: ignore[method-assign]
    service.mirror.on_podgroups("SYNC", [podgroup("urgent", 2)])
    for i in range(2):
        urgent = member(f"urgent-{i}", "urgent", 8)
        urgent["spec"]["priority"] = 1000
        service.mirror.on_pods("ADDED", urgent)
    cycle(service)
    deleted = [p.rsplit("/", 1)[1] for m, p, _ in writer(service).writes if m == "DELETE"]
    assert len(refused) == 1 and len(deleted) == 1
    service.mirror.on_pods("DELETED", next(f for f in fillers if f["metadata"]["name"] == deleted[0]))  # it left
    for _ in range(3):
        cycle(service)
    deleted = [p.rsplit("/", 1)[1] for m, p, _ in writer(service).writes if m == "DELETE"]
    assert refused[0] in deleted, f"{refused[0]} was never deleted again: {deleted}"


def test_a_podgroup_whose_min_resources_are_not_free_holds_nothing_and_its_members_are_told(
    service: CustomScheduler,
) -> None:
    group = podgroup("big", 2)
    group["spec"]["minResources"] = {GPU: "40"}  # the cluster has 32
    service.mirror.on_podgroups("SYNC", [group])
    for i in range(2):
        service.mirror.on_pods("ADDED", member(f"big-{i}", "big", 1))
    cycle(service)
    assert writer(service).bindings() == []
    refused = {e["involvedObject"]["name"]: e["message"] for e in writer(service).events("FailedScheduling")}
    assert refused.keys() == {"big", "big-0", "big-1"}, "the PodGroup and its members are told"
    assert refused["big-0"] == (
        "gang ml/big: PodGroup.spec.minResources is not free in the cluster: 40 nvidia.com/gpu (free: 32)"
    )


def test_a_podgroup_that_cannot_be_read_gets_the_reason_as_an_event_on_itself_too(service: CustomScheduler) -> None:
    service.mirror.on_podgroups("SYNC", [podgroup("zero", 0)])
    service.mirror.on_pods("ADDED", member("zero-0", "zero", 1))
    cycle(service)
    on_group = [e for e in writer(service).events("FailedScheduling") if e["involvedObject"]["kind"] == "PodGroup"]
    assert [e["message"] for e in on_group] == [
        "PodGroup ml/zero cannot be read: PodGroup.spec.minMember: 0 is out of range (1 to 10000)"
    ]
    assert on_group[0]["involvedObject"]["uid"] == "pg-uid"


class NoCrd:
    """Stands in for `KubeClient` on a server without the PodGroup CRD: discovery of its group answers 404."""

    def __init__(self) -> None:
        self.asked = 0

    def get(self, path: str, **_params: Any) -> Any:
        self.asked += 1
        raise ApiError(404, "NotFound", "the server could not find the requested resource")


def test_without_the_crd_readyz_names_podgroups_the_log_says_so_once_and_kueue_gangs_still_bind(
    service: CustomScheduler, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubegpu.scheduler import mirror as mirror_module

    monkeypatch.setattr(mirror_module, "PODGROUP_RECHECK", 0.01)
    client = NoCrd()
    service.mirror.client = client  # type: ignore[assignment]
    thread = threading.Thread(target=service.mirror.watch_podgroup_versions, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while client.asked < 3 or service.mirror.events.empty():
        assert time.monotonic() < deadline, "discovery asked again"
        time.sleep(0.01)
    service.stop.set()
    thread.join(5)
    cycle(service)
    status, body = answer_health("/readyz", service.mirror, service.metrics)  # type: ignore[misc]
    assert status == 200
    assert body["missing"] == ["the API server serves no version of podgroups that kubegpu reads"]
    assert caplog.text.count("the API server serves no PodGroups") == 1

    for i in range(2):
        pod = member(f"k-{i}", "", 8, **{"kueue.x-k8s.io/pod-group-name": "k"})
        pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] = "2"
        service.mirror.on_pods("ADDED", pod)
    cycle(service)
    assert sorted(writer(service).bindings()) == ["k-0", "k-1"]


class Forbidden(NoCrd):
    """A server that serves PodGroups to a scheduler whose role predates gangs: listing them answers 403."""

    def get(self, path: str, **_params: Any) -> Any:
        self.asked += 1
        if path == "/apis/scheduling.x-k8s.io":
            version = {"groupVersion": "scheduling.x-k8s.io/v1alpha1", "version": "v1alpha1"}
            return {"kind": "APIGroup", "name": "scheduling.x-k8s.io", "versions": [version]}
        raise ApiError(403, "Forbidden", 'podgroups.scheduling.x-k8s.io is forbidden: User "x" cannot list')


def test_a_role_that_may_not_list_podgroups_leaves_the_scheduler_ready_and_says_so(
    service: CustomScheduler, caplog: pytest.LogCaptureFixture
) -> None:
    client = Forbidden()
    service.mirror.client = client  # type: ignore[assignment]
    thread = threading.Thread(target=service.mirror.watch_podgroup_versions, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while service.mirror.events.empty():
        assert time.monotonic() < deadline, "the PodGroups given up for now"
        time.sleep(0.01)
    service.stop.set()
    thread.join(5)
    cycle(service)
    status, body = answer_health("/readyz", service.mirror, service.metrics)  # type: ignore[misc]
    assert status == 200 and body["apis"]["podgroups"] is None
    assert "this scheduler may not list PodGroups (403 Forbidden)" in caplog.text


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        (Counts(members=2), "Pending"),
        (Counts(members=3), "PreScheduling"),
        (Counts(members=3, scheduled=1), "Scheduling"),
        (Counts(members=3, scheduled=3), "Scheduled"),
        (Counts(members=3, scheduled=3, running=3), "Running"),
        (Counts(members=3, scheduled=3, running=2, succeeded=1), "Running"),
        (Counts(members=3, scheduled=3, succeeded=3), "Finished"),
        (Counts(members=3, scheduled=3, running=2, failed=1), "Failed"),
        (Counts(members=4, scheduled=4, running=3, failed=1), "Running"),
    ],
    ids=[
        "too-few",
        "enough",
        "one-bound",
        "bound",
        "running",
        "running-and-done",
        "finished",
        "failed",
        "spare-failed",
    ],
)
def test_the_phase_of_a_gang_of_min_member_3_follows_its_members(counts: Counts, expected: str) -> None:
    assert phase(3, counts) == expected


# -- the extender: kube-scheduler binds members one by one; kubegpu answers every member alike --------------------


def extender_with_racks() -> Any:
    from kubegpu.scheduler.extender import ExtenderServer

    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), signing_key=KEY)
    engine.set_topology([RACK])
    extender = ExtenderServer(engine, None, None)  # type: ignore[arg-type]
    extender.mirror.on_nodes("SYNC", [node(f"{rack}-n{i}", rack) for rack in ("r1", "r2") for i in range(2)])
    extender.mirror.on_namespaces("SYNC", [])
    extender.mirror.on_podgroups("SYNC", [podgroup("train", 2), podgroup("big", 3, uid="b")])
    return extender


def filtered(extender: Any, pod: dict[str, Any]) -> dict[str, Any]:
    import orjson

    names = ["r1-n0", "r1-n1", "r2-n0", "r2-n1"]
    answer: dict[str, Any] = extender.filter(orjson.dumps({"Pod": pod, "NodeNames": names}))
    return answer


def test_the_extender_passes_no_member_before_the_gang_exists_then_only_the_nodes_of_its_one_rack() -> None:
    extender = extender_with_racks()
    first = member("train-0", "train")
    extender.mirror.on_pods("ADDED", first)
    answer = filtered(extender, first)
    assert answer["NodeNames"] == []
    assert "1 of minMember 2 members exist" in answer["FailedNodes"]["r1-n0"]

    second = member("train-1", "train")
    extender.mirror.on_pods("ADDED", second)
    answers = [filtered(extender, pod)["NodeNames"] for pod in (first, second)]
    assert answers[0] == answers[1] and len(answers[0]) == 2, answers
    assert len({name.split("-")[0] for name in answers[0]}) == 1, "one rack"
    assert extender.engine.placement("ml/train-0") is None, "a filter holds nothing"


def test_the_extender_refuses_every_node_to_a_gang_that_fits_in_no_rack() -> None:
    extender = extender_with_racks()
    pods = [member(f"big-{i}", "big") for i in range(3)]
    for pod in pods:
        extender.mirror.on_pods("ADDED", pod)
    answer = filtered(extender, pods[0])
    assert answer["NodeNames"] == []
    assert "gang ml/big: 3 members need 8 nvidia.com/gpu each" in answer["FailedNodes"]["r2-n1"]


def test_what_the_scheduler_remembers_of_a_gang_goes_with_its_last_member(service: CustomScheduler) -> None:
    # Every gang tried left its scheduleStartTime (and last status) behind for the scheduler's lifetime: a tenant
    # whose jobs come and go, each a gang of its own name, grew the scheduler's memory without bound.
    for i in range(50):
        pod = member(f"job{i}-0", "", 1, **{"kueue.x-k8s.io/pod-group-name": f"job{i}"})
        pod["metadata"].setdefault("annotations", {})["kueue.x-k8s.io/pod-group-total-count"] = "1"
        service.mirror.on_pods("ADDED", pod)
        cycle(service)
        assert f"job{i}-0" in writer(service).bindings()
        report_bound(service, pod)
        cycle(service)
        service.mirror.on_pods("DELETED", pod)
        cycle(service)
    remembered = {name: len(table) for name, table in vars(service.groups).items() if isinstance(table, dict)}
    assert remembered == dict.fromkeys(remembered, 0), remembered


def test_a_podgroup_made_again_under_its_name_gets_its_status_written(service: CustomScheduler) -> None:
    # `train` was deleted and made again (kubectl replace, a job controller re-creating it) while its members ran:
    # the scheduler remembered the status it wrote on the old PodGroup by name, and the new one stayed without a
    # status (no phase) for as long as its members' counts did not change.
    service.mirror.on_podgroups("SYNC", [podgroup("train", 1)])
    service.mirror.on_pods("ADDED", member("train-0", "train", 4))
    cycle(service)
    bound_as_the_api_server_reports(service, "train-0")
    cycle(service)
    assert status_patches(service, "train")[-1]["phase"] == "Scheduled"
    written = len(status_patches(service, "train"))
    service.mirror.on_podgroups("DELETED", podgroup("train", 1))
    service.mirror.on_podgroups("ADDED", podgroup("train", 1, uid="pg-uid-2"))
    cycle(service)
    patches = status_patches(service, "train")
    assert len(patches) > written and patches[-1]["phase"] == "Scheduled", patches
    assert [e["involvedObject"]["uid"] for e in writer(service).events("Scheduled")] == ["pg-uid", "pg-uid-2"]


def test_members_arriving_one_by_one_for_a_gang_no_rack_fits_are_told_the_count_the_rack_lacks(
    service: CustomScheduler,
) -> None:
    # minMember 3 of 8 GPUs each, in one rack of 2 nodes: the first two members hold nothing, and their reason
    # counts minMember's members, not the two that exist ("2 members need 8 ...; the rack has 2 such nodes free"
    # read as a contradiction to the job's owner).
    service.mirror.on_podgroups("SYNC", [podgroup("wide", 3)])
    for i in range(2):
        service.mirror.on_pods("ADDED", member(f"wide-{i}", "wide"))
    cycle(service)
    assert all(service.engine.placement(f"ml/wide-{i}") is None for i in range(2)), "nothing held"
    refused = {e["involvedObject"]["name"]: e["message"] for e in writer(service).events("FailedScheduling")}
    assert set(refused) == {"wide-0", "wide-1", "wide"}
    assert refused["wide-0"] == (
        "gang ml/wide: 3 members (minMember 3, 2 so far) need 8 nvidia.com/gpu each; "
        "the largest rack (r1) has 2 such nodes free"
    ), refused["wide-0"]


def test_a_worker_whose_podgroup_label_has_a_typo_is_told_it_runs_alone_once(service: CustomScheduler) -> None:
    service.queue.initial_backoff = service.queue.max_backoff = 0.0
    service.mirror.on_podgroups("SYNC", [podgroup("train", 3)])
    for name, group in (("train-0", "train"), ("train-1", "train"), ("train-2", "trian")):
        service.mirror.on_pods("ADDED", member(name, group, 4))
    service.mirror.on_pods("ADDED", member("big", "trian", 16))  # fits on no node: refused, and tried again
    cycle(service)
    service.mirror.on_nodes("ADDED", node("r3-n0", "r3"))  # a change in the cluster: the refused pod is tried again
    cycle(service)
    attempts = [e for e in writer(service).events("FailedScheduling") if e["involvedObject"]["name"] == "big"]
    assert len(attempts) == 2, "tried again (0/4 nodes, then 0/5), refused again"
    assert writer(service).bindings() == ["train-2"], "the worker with the typo goes alone, as with coscheduling"
    told = writer(service).events("PodGroupNotFound")
    assert sorted(e["involvedObject"]["name"] for e in told) == ["big", "train-2"], "each told once"
    assert told[0]["type"] == "Warning"
    assert told[0]["message"] == (
        "PodGroup ml/trian does not exist: the pod is scheduled alone, not as a member of a gang "
        "(check its scheduling.x-k8s.io/pod-group label, or create the PodGroup before its pods)"
    )
    assert {e["involvedObject"]["name"] for e in writer(service).events("WaitingForGang")} == {"train-0", "train-1"}


def test_members_waiting_at_permit_when_their_podgroup_is_deleted_let_their_places_go_at_once(
    service: CustomScheduler,
) -> None:
    # A PodGroup with a week's timeout deleted while 2 of its 3 members wait: they neither keep their places for
    # the week nor keep every other gang from waiting (one gang partly held at a time); they go alone, as a pod of
    # no PodGroup does, each told so.
    service.queue.initial_backoff = service.queue.max_backoff = 0.0
    train = podgroup("train", 3, timeout=604_800)
    service.mirror.on_podgroups("SYNC", [train, podgroup("blue", 2, uid="blue-uid")])
    for i in range(2):
        service.mirror.on_pods("ADDED", member(f"train-{i}", "train", 4))
    cycle(service)
    assert writer(service).bindings() == [] and len(writer(service).events("WaitingForGang")) == 2
    service.mirror.on_podgroups("DELETED", train)
    cycle(service)
    assert sorted(writer(service).bindings()) == ["train-0", "train-1"], "let go, then placed alone"
    told = writer(service).events("PodGroupNotFound")
    assert sorted(e["involvedObject"]["name"] for e in told) == ["train-0", "train-1"]
    assert told[0]["message"].startswith("PodGroup ml/train does not exist: the pod is scheduled alone")
    service.mirror.on_pods("ADDED", member("blue-0", "blue", 4))
    cycle(service)
    assert service.engine.placement("ml/blue-0") is not None, "another gang may wait at Permit now"
    assert writer(service).events("FailedScheduling") == []


def test_members_waiting_at_permit_are_bound_when_their_podgroups_min_member_is_lowered_to_them(
    service: CustomScheduler,
) -> None:
    service.mirror.on_podgroups("SYNC", [podgroup("train", 3)])
    for i in range(2):
        service.mirror.on_pods("ADDED", member(f"train-{i}", "train", 4))
    cycle(service)
    assert writer(service).bindings() == []
    lowered = podgroup("train", 2)
    lowered["metadata"]["resourceVersion"] = "2"
    service.mirror.on_podgroups("MODIFIED", lowered)
    cycle(service)
    assert sorted(writer(service).bindings()) == ["train-0", "train-1"], "not left waiting until the timeout"


def test_a_member_deleted_while_its_gang_waits_at_permit_leaves_nothing_of_itself_behind(
    service: CustomScheduler,
) -> None:
    # A job controller that deletes a waiting worker and makes another under a new name (a tenant can do it in a
    # loop): the deleted one's bind decision and its place in the gang's waiting list were kept until the gang's
    # timeout (up to a week), one more of each per deletion.
    service.mirror.on_podgroups("SYNC", [podgroup("train", 3, timeout=604_800)])
    for i in range(2):
        service.mirror.on_pods("ADDED", member(f"train-{i}", "train", 4))
    cycle(service)
    assert writer(service).bindings() == []
    for round_ in range(20):
        name = f"train-1-{round_}" if round_ else "train-1"
        service.mirror.on_pods("DELETED", member(name, "train", 4))
        service.mirror.on_pods("ADDED", member(f"train-1-{round_ + 1}", "train", 4))
        cycle(service)
    engine = service.engine
    assert set(engine.waiting) == {"ml/train-0", "ml/train-1-20"}, "the deleted members wait no more"
    assert set(service._at_permit) == {"ml/train-0", "ml/train-1-20"}, "no bind decision of a deleted member stays"
    assert engine.waiting_gangs() == {"ml/train": ("ml/train-0", "ml/train-1-20")}
    service.mirror.on_pods("ADDED", member("train-2", "train", 4))
    cycle(service)
    assert sorted(writer(service).bindings()) == ["train-0", "train-1-20", "train-2"]
    assert engine.waiting == {} and service._at_permit == {}


def test_a_member_whose_node_is_deleted_while_its_gang_waits_at_permit_is_placed_again_beside_the_others(
    service: CustomScheduler,
) -> None:
    # Its place went with the node. It was kept as the node's orphan (counted as bound to it, had the node come
    # back) and held at Permit until the gang's timeout, so the member that completed the gang found one too few
    # holding places, and the gang bound nothing for an hour.
    service.mirror.on_podgroups("SYNC", [podgroup("train", 3, timeout=3600)])
    for i in range(2):
        service.mirror.on_pods("ADDED", member(f"train-{i}", "train", 2))
    cycle(service)
    assert writer(service).bindings() == []
    gone = service.engine.placement("ml/train-0").node  # type: ignore[union-attr]
    lost = node(gone, gone.split("-")[0])
    service.mirror.on_nodes("DELETED", lost)
    assert "ml/train-0" not in service.mirror._orphans, "bound nowhere, it is no orphan of the node"
    cycle(service)
    assert writer(service).bindings() == []
    service.mirror.on_pods("ADDED", member("train-2", "train", 2))
    cycle(service)
    assert sorted(writer(service).bindings()) == ["train-0", "train-1", "train-2"], "bound now, not in an hour"
    placed = {service.engine.placement(f"ml/train-{i}").node for i in range(3)}  # type: ignore[union-attr]
    assert gone not in placed and len({name.split("-")[0] for name in placed}) == 1, placed
    for i in range(3):
        bound_as_the_api_server_reports(service, f"train-{i}", gpus=2)
    service.mirror.on_nodes("ADDED", lost)  # the same node back: nothing is counted on it
    assert service.engine.holders(gone) == []


def test_a_gang_whose_first_member_was_placed_where_the_others_do_not_fit_is_placed_afresh_where_all_do(
    service: CustomScheduler,
) -> None:
    # A 1-GPU driver that arrives before its two 8-GPU workers is placed where 3 drivers would fit (best fit: the
    # half-full rack r1); the workers find no room beside it. The whole gang fits in rack r2: it was left waiting
    # there for the PodGroup's timeout (an hour), the workers told r1 has room for none of them.
    service.mirror.on_nodes("ADDED", node("r2-n2", "r2"))
    filler = member("filler", "", 8)
    service.mirror.on_pods("ADDED", filler)
    cycle(service)
    assert service.engine.placement("ml/filler").node.startswith("r1-")  # type: ignore[union-attr]
    service.mirror.on_podgroups("SYNC", [podgroup("job", 3, timeout=3600)])
    service.mirror.on_pods("ADDED", member("job-driver", "job", 1))
    cycle(service)
    assert service.engine.placement("ml/job-driver").node.startswith("r1-")  # type: ignore[union-attr]
    for i in range(2):
        service.mirror.on_pods("ADDED", member(f"job-worker-{i}", "job", 8))
        cycle(service)
    assert sorted(writer(service).bindings()) == ["filler", "job-driver", "job-worker-0", "job-worker-1"]
    racks = {service.engine.placement(f"ml/{n}").node[:2] for n in ("job-driver", "job-worker-0", "job-worker-1")}  # type: ignore[union-attr]
    assert racks == {"r2"}
    assert not [e for e in writer(service).events("FailedScheduling") if "room for 0" in e["message"]]


def test_a_gang_refused_while_another_was_partly_held_is_tried_again_once_that_one_is_placed(
    service: CustomScheduler,
) -> None:
    # Two gangs interleaved member by member: green's first member was refused while blue was partly held, and kept
    # saying "gang ml/blue is partly held" (holding nothing) after blue was bound whole, until green's next member
    # came or the cluster changed.
    service.queue.initial_backoff = service.queue.max_backoff = 0.0
    service.mirror.on_podgroups("SYNC", [podgroup("blue", 2), podgroup("green", 2, uid="g")])
    service.mirror.on_pods("ADDED", member("blue-0", "blue"))
    cycle(service)
    service.mirror.on_pods("ADDED", member("green-0", "green"))
    cycle(service)
    (refused,) = [
        e["message"] for e in writer(service).events("FailedScheduling") if e["involvedObject"]["name"] == "green-0"
    ]
    assert "gang ml/blue is partly held" in refused
    service.mirror.on_pods("ADDED", member("blue-1", "blue"))
    cycle(service)
    assert sorted(writer(service).bindings()) == ["blue-0", "blue-1"]
    cycle(service)
    assert service.engine.placement("ml/green-0") is not None, "green holds its place now that blue is whole"
    (waits,) = [
        e["message"] for e in writer(service).events("WaitingForGang") if e["involvedObject"]["name"] == "green-0"
    ]
    assert "gang ml/green: 1 of minMember 2 members hold places" in waits
    service.mirror.on_pods("ADDED", member("green-1", "green"))
    cycle(service)
    assert sorted(writer(service).bindings()) == ["blue-0", "blue-1", "green-0", "green-1"]


def test_gangs_refused_while_another_is_partly_held_are_forgotten_when_their_members_go(
    service: CustomScheduler,
) -> None:
    # A tenant keeps gang blue partly held (one member of two, an hour's timeout) and meanwhile creates gangs under
    # new names, each refused ('gang ml/blue is partly held'), and deletes them: each name stayed remembered until no
    # gang was partly held any more (an hour, a week with the longest timeout), one per gang created.
    service.queue.initial_backoff = service.queue.max_backoff = 0.0
    groups = [podgroup("blue", 2, timeout=3600)] + [podgroup(f"churn-{i}", 2, uid=f"c{i}") for i in range(20)]
    service.mirror.on_podgroups("SYNC", groups)
    service.mirror.on_pods("ADDED", member("blue-0", "blue"))
    cycle(service)
    for i in range(20):
        churned = member(f"churn-{i}-0", f"churn-{i}")
        service.mirror.on_pods("ADDED", churned)
        cycle(service)
        service.mirror.on_pods("DELETED", churned)
        cycle(service)
    refused = {
        e["involvedObject"]["name"]
        for e in writer(service).events("FailedScheduling")
        if e["involvedObject"]["kind"] == "Pod" and "gang ml/blue is partly held" in e["message"]
    }
    assert refused == {f"churn-{i}-0" for i in range(20)}
    assert service._blocked == set(), "nothing stays of the gangs whose members are all gone"
    assert service.engine.is_waiting("ml/blue-0")


def test_a_preemption_weighing_a_waiting_members_node_does_not_restart_its_gangs_timeout(
    service: CustomScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Gang blue (5 s timeout) has one member of two waiting at Permit. A pod of higher priority preempts elsewhere,
    # its what-if weighing blue-0's node too: that made blue-0 wait at Permit no more (it kept its place), the next
    # tick queued it again ('its node is gone', though it was not) and it waited afresh, its timeout restarted; a
    # preemption every few seconds kept the gang partly held, and every other gang refused, for as long as they came.
    service.queue.initial_backoff = service.queue.max_backoff = 0.0
    service.mirror.on_podgroups("SYNC", [podgroup("blue", 2, timeout=5)])
    for name in ("r2-n0", "r2-n1"):
        service.mirror.on_pods("ADDED", bound_low(name, name))
    start = time.monotonic()
    monkeypatch.setattr(custom_module.time, "monotonic", lambda: start)
    service.mirror.on_pods("ADDED", member("blue-0", "blue"))
    cycle(service)
    held = service.engine.placement("ml/blue-0")
    assert held is not None and service.engine.is_waiting("ml/blue-0")
    other = "r1-n1" if held.node == "r1-n0" else "r1-n0"
    service.mirror.on_pods("ADDED", bound_low(other, other))
    high = pod_manifest("high", {"main": {GPU: 8}}, namespace="ml", scheduler_name="kubegpu")
    high["metadata"].update(uid="uid-high", resourceVersion="1")
    high["spec"]["priority"] = 1000
    service.mirror.on_pods("ADDED", high)
    cycle(service)
    assert [p for m, p, _ in writer(service).writes if m == "DELETE"], "the high pod preempted a pod of priority -10"
    assert service.engine.is_waiting("ml/blue-0"), "weighing its node took nothing from blue-0"
    monkeypatch.setattr(custom_module.time, "monotonic", lambda: start + 3)
    cycle(service)
    monkeypatch.setattr(custom_module.time, "monotonic", lambda: start + 6)
    cycle(service)
    timed_out = [
        e["message"]
        for e in writer(service).events("FailedScheduling")
        if e["involvedObject"]["name"] == "blue-0" and "timed out" in e["message"]
    ]
    assert timed_out and "timed out after 5s waiting at Permit" in timed_out[0]


def bound_low(name: str, node_name: str) -> dict[str, Any]:
    """An 8-GPU pod of priority -10 another scheduler bound to `node_name`."""
    manifest = pod_manifest(f"low-{name}", {"main": {GPU: 8}}, namespace="ml", scheduler_name="other")
    manifest["metadata"].update(uid=f"uid-low-{name}", resourceVersion="1")
    manifest["spec"].update(nodeName=node_name, priority=-10)
    manifest["status"] = {"phase": "Running"}
    return manifest


def test_members_waiting_at_permit_preempted_by_a_pod_are_let_go_whole_not_deleted_and_come_back_whole(
    service: CustomScheduler,
) -> None:
    # Gang blue (minMember 3) has two members waiting at Permit, holding two of r1's three nodes; the other nodes run
    # pods of a higher priority still. A pod of priority 1000 needs a whole node: blue's waiting members are the only
    # pods it may preempt.
    service.queue.initial_backoff = service.queue.max_backoff = 0.0
    service.mirror.on_nodes("ADDED", node("r1-n2", "r1"))
    service.mirror.on_podgroups("SYNC", [podgroup("blue", 3)])
    for name in ("r2-n0", "r2-n1"):
        high_bound = bound_low(name, name)
        high_bound["spec"]["priority"] = 5000
        service.mirror.on_pods("ADDED", high_bound)
    blue = [member(f"blue-{i}", "blue") for i in range(2)]
    for manifest in blue:
        service.mirror.on_pods("ADDED", manifest)
    cycle(service)
    assert all(service.engine.is_waiting(f"ml/blue-{i}") for i in range(2))
    free = next(n for n in ("r1-n0", "r1-n1", "r1-n2") if not service.engine.nodes[n].pods)
    taken = bound_low(free, free)
    taken["spec"]["priority"] = 5000
    service.mirror.on_pods("ADDED", taken)
    high = pod_manifest("high", {"main": {GPU: 8}}, namespace="ml", scheduler_name="kubegpu")
    high["metadata"].update(uid="uid-high", resourceVersion="1")
    high["spec"]["priority"] = 1000
    service.mirror.on_pods("ADDED", high)
    cycle(service)
    deleted = [p.rsplit("/", 1)[1] for m, p, _ in writer(service).writes if m == "DELETE"]
    assert deleted == [], "a member waiting at Permit is bound nowhere: it is let go, not deleted (its job lives on)"
    assert not any(service.engine.is_waiting(f"ml/blue-{i}") for i in range(2)), "the whole gang is let go at once"
    assert all(service.engine.placement(f"ml/blue-{i}") is None for i in range(2)), "no place is left held"
    cycle(service)
    assert "high" in writer(service).bindings()
    told = [e["message"] for e in writer(service).events("FailedScheduling") if e["involvedObject"]["name"] == "blue-1"]
    assert any(m.startswith("preempted by pod ml/high on node r1-") and "gang ml/blue gave back" in m for m in told)
    assert service.engine.waiting_gangs() == {}, "blue holds nothing while no rack has room for it"

    # The high pod and the one beside it finish: blue is placed again, its members waiting together, and the third
    # completes it.
    service.mirror.on_pods("DELETED", report_bound(service, high))
    service.mirror.on_pods("DELETED", taken)
    cycle(service)
    cycle(service)
    assert all(service.engine.is_waiting(f"ml/blue-{i}") for i in range(2))
    service.mirror.on_pods("ADDED", member("blue-2", "blue"))
    cycle(service)
    assert {"blue-0", "blue-1"} <= set(writer(service).bindings())


def test_a_member_waiting_at_permit_edited_into_a_pod_kubegpu_cannot_read_gives_its_place_back(
    service: CustomScheduler,
) -> None:
    # `train-0` holds 8 GPUs at Permit, waiting for `train-1`. Its owner then annotates it for Microsoft KubeGPU,
    # asking a GPU for its sidecar in a way kubegpu cannot read. It kept its GPUs until the gang's timeout, and was
    # bound from its old version once `train-1` came.
    service.mirror.on_podgroups("SYNC", [podgroup("train", 2)])

    def with_sidecar(name: str, **annotations: str) -> dict[str, Any]:
        manifest = member(name, "train")
        manifest["spec"]["containers"].append({"name": "side", "image": "busybox"})
        manifest["metadata"]["annotations"] = annotations
        return manifest

    service.mirror.on_pods("ADDED", with_sidecar("train-0"))
    cycle(service)
    assert service.engine.is_waiting("ml/train-0")
    asks = '{"runningcontainer": {"side": {"requests": {"alpha.gpu/numgpu": 1}}}}'
    edited = with_sidecar("train-0", **{"pod.alpha/DeviceInformation": asks})
    edited["metadata"]["resourceVersion"] = "2"
    service.mirror.on_pods("MODIFIED", edited)
    assert service.engine.placement("ml/train-0") is None, "its GPUs are free at once"
    service.mirror.on_pods("ADDED", with_sidecar("train-1"))
    cycle(service)
    assert writer(service).bindings() == []
    refused = [
        e["message"] for e in writer(service).events("FailedScheduling") if e["involvedObject"]["name"] == "train-0"
    ]
    assert len(refused) == 1 and "kubegpu cannot schedule this pod" in refused[0] and "container side" in refused[0]


def test_a_gang_preempting_a_rack_displaces_the_pod_of_lower_priority_nominated_there(
    service: CustomScheduler,
) -> None:
    # `single` (priority 100) preempted on rack r1, the only one whose pods it may evict, and was nominated there.
    # Then gang `urgent` (1000) preempts all of r1, the only rack it may have. `single` kept its hold and its
    # `status.nominatedNodeName`, waiting for victims whose room is now the gang's, as a pod preempting there would
    # not let it (kube-scheduler clears the nominations of lower priority where it preempts).
    service.queue.initial_backoff = service.queue.max_backoff = 0.0
    for name, priority in (("r1-n0", 0), ("r1-n1", 0), ("r2-n0", 5000), ("r2-n1", 5000)):
        filler = member(f"filler-{name}", "", 8)
        filler["spec"].update(nodeName=name, priority=priority, schedulerName="someone-else")
        service.mirror.on_pods("ADDED", filler)
    single = member("single", "", 8)
    single["spec"]["priority"] = 100
    service.mirror.on_pods("ADDED", single)
    cycle(service)
    held = service.engine.nominated_node("ml/single")
    assert held is not None and held.startswith("r1-"), held
    service.mirror.on_podgroups("SYNC", [podgroup("urgent", 2)])
    for i in range(2):
        urgent = member(f"urgent-{i}", "urgent", 8)
        urgent["spec"]["priority"] = 1000
        service.mirror.on_pods("ADDED", urgent)
    cycle(service)
    assert service.engine.nominated_gangs, "the gang preempted"
    assert service.engine.nominated_node("ml/single") is None, "r1 is the gang's"
    nominations = [
        b["status"]["nominatedNodeName"]
        for m, p, b in writer(service).writes
        if p.endswith("/pods/single/status") and "nominatedNodeName" in b["status"]
    ]
    assert nominations[-1] is None, nominations
