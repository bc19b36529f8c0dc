"""The custom scheduler decides and binds only while it leads (`kubegpu.kube.leader.Leadership`).

As in test_service_guards.py, the scheduler runs without a cluster. Its leadership is a deadline the elector moves;
here the tests set it, as a lapse would leave it: a replica past its deadline decides nothing, keeps its pods for the
next leader, and a Binding refused unsent by the fenced writer is rolled back without asking the API server about it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kubegpu.cli import main
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.kube.client import ApiError, Fenced
from kubegpu.kube.leader import Leadership
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine

from . import toy_plugin as toy
from .test_service_guards import KEY, RecordingWriter, pod, schedule_all


class LapsingLeadership(Leadership):
    """Holds for the first `checks` reads, then lapses (as the deadline passing mid-batch does)."""

    def __init__(self, checks: int) -> None:
        super().__init__(time.monotonic() + 60)
        self.checks = checks

    def holds(self) -> bool:
        self.checks -= 1
        return self.checks >= 0


class FencedWriter(RecordingWriter):
    """A writer whose fence has run out: every write is refused unsent, as `AsyncKubeClient` refuses it."""

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        if method == "GET":
            self.writes.append((method, path, body))
            return {}
        raise Fenced(method, path)


def service(
    leadership: Leadership, writer: RecordingWriter | None = None, client: Any = None, leader_elect: bool = False
) -> CustomScheduler:
    """A scheduler of the toy plugin's pods with node n1 (4 cards) synced."""
    plugins = make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False)
    svc = CustomScheduler(
        client,
        writer or RecordingWriter(),  # type: ignore[arg-type]
        Engine(plugins, signing_key=KEY),
        name="kubegpu",
        leadership=leadership,
        leader_elect=leader_elect,
    )
    node = node_manifest("n1", labels={"toy.example/cards": "4"}, allocatable={"toy.example/card": 4})
    svc.mirror.on_nodes("SYNC", [node])
    return svc


def bindings(svc: CustomScheduler) -> list[str]:
    return svc.binder.writer.bindings()  # type: ignore[attr-defined,no-any-return]


def test_a_replica_past_its_deadline_decides_nothing_and_keeps_its_pods() -> None:
    svc = service(Leadership())  # never led, or its deadline passed
    svc.mirror.on_pods("SYNC", [pod("a"), pod("b")])
    schedule_all(svc)
    assert bindings(svc) == [] and svc.binder.writer.writes == []  # type: ignore[attr-defined]
    assert set(svc.queue.active) == {"default/a", "default/b"}
    assert list(svc.engine.placements(["default/a", "default/b"])) == []
    svc.leadership.extend(time.monotonic() + 10)  # the Lease taken (again, by a fresh process in practice)
    schedule_all(svc)
    assert sorted(bindings(svc)) == ["a", "b"]


def test_a_deadline_passing_mid_batch_leaves_the_untried_pods_queued() -> None:
    svc = service(LapsingLeadership(checks=2))
    svc.mirror.on_pods("SYNC", [pod(name) for name in ("a", "b", "c", "d")])
    schedule_all(svc)
    assert bindings(svc) == ["a", "b"]
    assert set(svc.queue.active) == {"default/c", "default/d"}, "the untried pods must wait for the next leader"


def test_without_leader_election_the_scheduler_always_acts() -> None:
    svc = service(Leadership.unconditional())
    svc.mirror.on_pods("SYNC", [pod("a")])
    schedule_all(svc)
    assert bindings(svc) == ["a"]


class ListingClient:
    """The API server as a new leader's fresh list reads it: `pods` is what etcd holds now."""

    def __init__(self, pods: list[dict[str, Any]], failures: list[Exception] | None = None) -> None:
        self.pods = pods
        self.failures = failures or []  # raised by the first lists, one each
        self.lists: list[str] = []

    def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists.append(path)
        if self.failures:
            raise self.failures.pop(0)
        return list(self.pods), "42"


@pytest.mark.parametrize(
    "failures",
    [[], [ApiError(503, "ServiceUnavailable", "etcd leader changed"), ValueError("a body that is not JSON")]],
    ids=["answered", "answered-after-two-failures"],
)
def test_a_new_leader_decides_nothing_until_a_list_made_after_it_took_the_lease_is_applied(
    failures: list[Exception],
) -> None:
    """The standby's watch has not delivered the previous leader's last Binding (`bound`, two of the node's four
    cards): in its mirror `waiting` (three cards) fits. Before deciding, it lists every pod afresh (asking again
    after a failure, whatever it was) and applies the list, so `waiting` is refused instead of being given cards
    `bound` holds."""
    bound = pod("bound", cards=2)
    bound["spec"]["nodeName"] = "n1"
    waiting = pod("waiting", cards=3)
    client = ListingClient([bound, waiting], list(failures))
    svc = service(Leadership(time.monotonic() + 60), client=client, leader_elect=True)
    svc.mirror.on_pods("SYNC", [waiting])  # the informer's view: the Binding of `bound` not delivered yet
    svc.mirror.ready = lambda: True  # type: ignore[method-assign]  # every informer's first list applied
    assert not svc._may_decide(), "a new leader decided on its informers' lists alone"
    svc.mirror.apply_events(10.0)  # the fresh list, once the catch-up thread has it
    assert client.lists == ["/api/v1/pods"] * (1 + len(failures))
    assert svc._may_decide()
    schedule_all(svc)
    assert bindings(svc) == [], "the new leader gave `waiting` cards the previous leader's pod holds"
    assert "default/waiting" in svc.queue.unschedulable


def test_a_binding_refused_unsent_is_rolled_back_without_reading_the_pod() -> None:
    """A Binding whose answer was lost is read back before anyone rolls it back; one the fence refused was never
    sent, so it is rolled back at once (no GET behind a backlog of writes)."""
    writer = FencedWriter()
    svc = service(Leadership.unconditional(), writer)
    svc.mirror.on_pods("SYNC", [pod("a", cards=4)])
    schedule_all(svc)
    assert writer.writes == [], "the pod was read back after a Binding that was never sent"
    assert list(svc.engine.placements(["default/a"])) == [], "the reservation was kept"
    assert any(entry.key == "default/a" for entry in svc.queue.backoff)
    value = svc.metrics.registry.get_sample_value("kubegpu_scheduler_bind_errors_total")
    assert not value


def test_timings_without_a_margin_stop_the_scheduler_before_it_starts(capsys: pytest.CaptureFixture[str]) -> None:
    """A renew deadline as long as the lease would let a standby take over while the leader still binds."""
    argv = ["scheduler", "--allocation-key-file", "/nonexistent", "--lease-duration", "10", "--renew-deadline", "10"]
    assert main(argv) == 2
    assert "--renew-deadline (10s) must be shorter than --lease-duration (10s)" in capsys.readouterr().err


class RacingClient(ListingClient):
    """The fresh list read from etcd while the watch delivers an event: the loop applies the event (`racing`)
    before the list, which is older than it."""

    def __init__(self, pods: list[dict[str, Any]], racing: tuple[str, dict[str, Any]]) -> None:
        super().__init__(pods)
        self.racing = racing
        self.mirror: Any = None

    def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
        listed = super().list(path, **params)
        self.mirror.post(self.mirror.on_pods, *self.racing)  # the watch, while the list's answer was on its way
        return listed


@pytest.mark.parametrize(
    ("informed", "listed", "racing", "expected"),
    [
        (["bound", "waiting"], ["bound", "waiting"], ("DELETED", "bound"), ["waiting"]),
        (["bound", "waiting"], ["bound", "waiting"], ("MODIFIED", "finished"), ["waiting"]),
        (["waiting"], ["waiting"], ("ADDED", "bound"), []),
    ],
    ids=["deleted-while-listing", "finished-while-listing", "bound-while-listing"],
)
def test_a_watch_event_applied_before_the_older_fresh_list_is_not_undone(
    informed: list[str], listed: list[str], racing: tuple[str, str], expected: list[str]
) -> None:
    """`bound` holds two of n1's four cards, `waiting` asks for three. The watch delivers `bound`'s deletion (its
    end, or its binding by another scheduler) while the new leader's fresh list, read before it, is on its way; the
    loop applies the event first. The older list must not bring the deleted or finished pod back (its cards held by
    nobody, for good: no later event of it need come), nor forget the bound one (its cards given again to
    `waiting`). Before: the ended `bound` was counted again and `waiting` refused, and the bound one forgotten and
    `waiting` bound beside it."""
    pods = {"bound": pod("bound", cards=2), "waiting": pod("waiting", cards=3)}
    pods["bound"]["spec"]["nodeName"] = "n1"
    pods["finished"] = {**pods["bound"], "status": {"phase": "Succeeded"}}
    client = RacingClient([pods[name] for name in listed], (racing[0], pods[racing[1]]))
    svc = service(Leadership(time.monotonic() + 60), client=client, leader_elect=True)
    client.mirror = svc.mirror
    svc.mirror.on_pods("SYNC", [pods[name] for name in informed])
    svc.mirror.ready = lambda: True  # type: ignore[method-assign]
    assert not svc._may_decide()
    deadline = time.monotonic() + 10
    while not svc._may_decide() and time.monotonic() < deadline:
        svc.mirror.apply_events(0.5)  # the watch's event, then the fresh list
    assert svc._may_decide()
    schedule_all(svc)
    assert bindings(svc) == expected


@pytest.mark.parametrize("late", [["DELETED"], ["MODIFIED", "DELETED"]], ids=["deleted", "bound-then-deleted"])
def test_a_late_event_of_an_older_pod_of_the_same_name_leaves_the_listed_one_counted(late: list[str]) -> None:
    """`web` was deleted and made again (another uid) around the handover, and the previous leader bound the new one
    to n1 (two of four cards). The new leader's fresh list shows it; the standby's lagging watch then delivers the
    old `web`'s last events. The old pod's deletion (or its sight bound, then deleted) must not take the listed pod
    out of the books: `waiting`, asking three cards, waits. Before, the old pod's deletion released the new one's
    cards and `waiting` was bound beside it."""
    new = pod("web", cards=2)
    new["spec"]["nodeName"] = "n1"
    old = pod("web", cards=2)
    old["metadata"]["uid"] = "uid-web-old"
    old["spec"]["nodeName"] = "n1"
    waiting = pod("waiting", cards=3)
    client = ListingClient([new, waiting])
    svc = service(Leadership(time.monotonic() + 60), client=client, leader_elect=True)
    svc.mirror.on_pods("SYNC", [waiting])
    svc.mirror.ready = lambda: True  # type: ignore[method-assign]
    assert not svc._may_decide()
    svc.mirror.apply_events(10.0)  # the fresh list
    assert svc._may_decide()
    for kind in late:  # the lagging watch catches up with the old pod
        svc.mirror.on_pods(kind, old)
    schedule_all(svc)
    assert bindings(svc) == [], "the new leader gave `waiting` cards the listed `web` holds"


def test_a_new_leader_whose_claims_list_is_not_found_asks_again_rather_than_never_deciding() -> None:
    """One of several API servers, behind a load balancer, answers the new leader's fresh list of ResourceClaims with
    404 (resource.k8s.io/v1 not enabled on it yet, mid-upgrade). The catch-up thread took that as "stopped" and
    ended without a word: the leader never decided anything again until restarted. It asks again, as after any
    other failure, and decides once the list is answered."""
    bound = pod("bound", cards=2)
    bound["spec"]["nodeName"] = "n1"
    waiting = pod("waiting", cards=3)

    class NotFoundOnce(ListingClient):
        def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
            if "resourceclaims" in path:
                self.lists.append(path)
                if len(self.lists) == 1:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return [], "42"
            return super().list(path, **params)

    client = NotFoundOnce([bound, waiting])
    svc = service(Leadership(time.monotonic() + 60), client=client, leader_elect=True)
    svc.mirror.dra_problem = None  # DRA was read when the informers started
    svc.mirror.on_pods("SYNC", [waiting])
    svc.mirror.ready = lambda: True  # type: ignore[method-assign]
    assert not svc._may_decide()
    deadline = time.monotonic() + 10
    while not svc._may_decide() and time.monotonic() < deadline:
        svc.mirror.apply_events(0.5)
    assert svc._may_decide(), f"the new leader never decided (lists asked: {client.lists})"
    schedule_all(svc)
    assert bindings(svc) == []


def test_an_informer_relist_applied_before_the_older_fresh_list_is_not_undone() -> None:
    """`bound` (two of n1's four cards) was deleted while the watch was down; the informer's relist, which no longer
    shows it, is applied while the new leader's fresh list, read before the deletion, is on its way. The older list
    must not bring `bound` back: no event of it will ever come again, and its cards would be held by nobody for good.
    Before, `waiting` (three cards) was refused beside the deleted pod."""
    bound = pod("bound", cards=2)
    bound["spec"]["nodeName"] = "n1"
    waiting = pod("waiting", cards=3)
    client = RacingClient([bound, waiting], ("SYNC", [waiting]))
    svc = service(Leadership(time.monotonic() + 60), client=client, leader_elect=True)
    client.mirror = svc.mirror
    svc.mirror.on_pods("SYNC", [bound, waiting])
    svc.mirror.ready = lambda: True  # type: ignore[method-assign]
    assert not svc._may_decide()
    deadline = time.monotonic() + 10
    while not svc._may_decide() and time.monotonic() < deadline:
        svc.mirror.apply_events(0.5)  # the relist, then the fresh list
    assert svc._may_decide()
    schedule_all(svc)
    assert bindings(svc) == ["waiting"], "the older fresh list brought back a pod the relist showed deleted"
