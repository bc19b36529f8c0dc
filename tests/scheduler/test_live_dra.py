"""The custom scheduler allocates DRA claims on a live server: it reads DeviceClasses, ResourceSlices,
ResourceClaimTemplates and ResourceClaims from its informers, makes a pod's claim from its template, writes the claim's
`status.allocation` and `status.reservedFor` before the Binding, and gives them back when the pod goes.

As in test_live_volumes.py the scheduler runs without a cluster: informer events are handed to its mirror directly.
The API server is `ClaimServer`, an in-memory stand-in for the parts of a 1.34 server these writes meet (claims with
a status subresource, resourceVersion conflicts, finalizers, UID preconditions), which can lose an answer after
applying a write. tests/integration/test_dra_live.py runs the same story on the real API server.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.kube.client import ApiError
from kubegpu.kube.leader import Leadership
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.draclaims import FINALIZER, POD_CLAIM_ANNOTATION
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.health import answer_health
from kubegpu.scheduler.mirror import DRA_KINDS, OWNER_PATHS
from kubegpu.scheduler.testing import (
    NEURON,
    claim,
    claim_pod,
    claim_spec,
    device_class,
    exactly,
    neuron_slice,
    template,
)

from .test_service_guards import KEY

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
NEURON_CLASS = device_class("neuron", f'device.driver == "{NEURON}"')


class ClaimServer:
    """Stands in for `AsyncKubeClient` and the API server behind it: ResourceClaims stored and served as a 1.34
    server does (POST, GET, PUT of the object and of `/status`, DELETE with finalizers and a UID precondition), every
    other write recorded. `lose` names writes ("PUT /status", "POST", ...) whose answer is lost once applied."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []
        self.claims: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.lose: set[str] = set()
        self.uids = 0

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        asyncio.run(coroutine)

    async def post(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body)

    async def patch(self, path: str, body: Any, *, strategic: bool = False) -> Any:
        return await self.request("PATCH", path, body)

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(obj)

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        self.writes.append((method, path, copy.deepcopy(body)))
        if not path.startswith(CLAIMS):
            return {}
        answer = self._claims(method, path, copy.deepcopy(body))
        kind = f"{method} /status" if path.endswith("/status") else method
        if kind in self.lose:
            self.lose.discard(kind)
            raise ApiError(0, "Unreachable", f"{method} {path}: connection reset")
        return answer

    def _claims(self, method: str, path: str, body: Any) -> Any:
        name = path[len(CLAIMS) + 1 :].removesuffix("/status")
        stored = self.claims.get(name)
        if method == "POST":
            name = body["metadata"]["name"]
            if name in self.claims:
                raise ApiError(409, "AlreadyExists", f'resourceclaims "{name}" already exists')
            self.uids += 1
            body["metadata"]["uid"] = f"claim-uid-{self.uids}"
            body.pop("status", None)
            self.claims[name] = body
            return self._bump(body)
        if stored is None:
            raise ApiError(404, "NotFound", f'resourceclaims "{name}" not found')
        if method == "GET":
            return copy.deepcopy(stored)
        if method == "DELETE":
            if body["preconditions"]["uid"] != stored["metadata"]["uid"]:
                raise ApiError(409, "Conflict", "Precondition failed: UID")
            if stored["metadata"].get("finalizers"):
                stored["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                return self._bump(stored)
            del self.claims[name]
            return {}
        if body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified; please apply your changes")
        if path.endswith("/status"):
            stored["status"] = body.get("status") or {}
        else:
            stored["metadata"]["finalizers"] = body["metadata"].get("finalizers") or []
            if stored["metadata"].get("deletionTimestamp") and not stored["metadata"]["finalizers"]:
                del self.claims[name]
                return copy.deepcopy(stored)
        return self._bump(stored)

    def bindings(self) -> dict[str, str]:
        return {b["metadata"]["name"]: b["target"]["name"] for m, p, b in self.writes if p.endswith("/binding")}

    def refusals(self, name: str) -> list[str]:
        return [
            b["message"]
            for m, p, b in self.writes
            if p.endswith("/events") and b["reason"] == "FailedScheduling" and b["involvedObject"]["name"] == name
        ]

    def devices(self, name: str) -> list[str]:
        allocation = (self.claims[name].get("status") or {}).get("allocation") or {}
        return [r["device"] for r in allocation["devices"]["results"]]


@pytest.fixture
def service() -> CustomScheduler:
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), signing_key=KEY)
    svc = CustomScheduler(None, ClaimServer(), engine, name="kubegpu")  # type: ignore[arg-type]
    mirror = svc.mirror
    mirror.on_nodes("SYNC", [node_manifest(n) for n in ("n1", "n2")])
    mirror.on_namespaces("SYNC", [])
    mirror.on_pods("SYNC", [])
    mirror.on_budgets("SYNC", [])
    mirror.on_claims("SYNC", [])
    mirror.on_volumes("SYNC", [])
    mirror.on_podgroups("SYNC", [])
    for kind in OWNER_PATHS:
        mirror.on_owners(kind, "SYNC", [])
    mirror.on_dra("deviceclasses", "SYNC", [NEURON_CLASS])
    mirror.on_dra("resourceslices", "SYNC", [neuron_slice("n1", 4), neuron_slice("n2", 4)])
    mirror.on_dra("resourceclaimtemplates", "SYNC", [template("two", claim_spec(exactly("devs", "neuron", 2)))])
    mirror.on_dra("resourceclaims", "SYNC", [])
    mirror.dra_problem = None  # what `watch_dra_versions` sets once discovery finds the four collections
    svc.queue.initial_backoff = 0.0  # a pod woken is tried at the next cycle
    return svc


def server(service: CustomScheduler) -> ClaimServer:
    return service.binder.writer  # type: ignore[return-value]


def pod(name: str, **refs: Any) -> dict[str, Any]:
    manifest = claim_pod(name, scheduler_name="kubegpu", **refs)
    manifest["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
    return manifest


def cycle(service: CustomScheduler) -> None:
    service.queue.promote()
    service.schedule_active(100)
    while not service.mirror.events.empty():  # binding results, claims given back
        service.mirror.handle(service.mirror.events.get_nowait())


def watch_claims(service: CustomScheduler) -> None:
    """The claims' informer reports what the server holds now (a relist)."""
    service.mirror.on_dra("resourceclaims", "SYNC", [copy.deepcopy(c) for c in server(service).claims.values()])


def test_a_template_claim_is_made_allocated_and_reserved_before_the_binding(service: CustomScheduler) -> None:
    service.mirror.on_pods("ADDED", pod("p", templates={"dev": "two"}))
    cycle(service)
    api = server(service)
    assert api.bindings() == {"p": "n1"}
    stored = api.claims["p-dev"]
    assert stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": True, "blockOwnerDeletion": True}
    ]
    assert stored["metadata"]["annotations"] == {POD_CLAIM_ANNOTATION: "dev"}
    assert stored["metadata"]["finalizers"] == [FINALIZER]
    assert stored["spec"] == claim_spec(exactly("devs", "neuron", 2))
    assert stored["status"]["reservedFor"] == [{"resource": "pods", "name": "p", "uid": "uid-p"}]
    assert stored["status"]["allocation"]["devices"]["results"] == [
        {"request": "devs", "driver": NEURON, "pool": "n1", "device": "neuron-0"},
        {"request": "devs", "driver": NEURON, "pool": "n1", "device": "neuron-1"},
    ]
    order = [(m, p.rsplit("/", 1)[-1]) for m, p, _ in api.writes if not p.endswith("/events")]
    assert order.index(("PUT", "status")) < order.index(("POST", "binding")), "allocation written before the Binding"
    status_patch = next(b for m, p, b in api.writes if m == "PATCH" and p.endswith("/pods/p/status"))
    assert status_patch == {"status": {"resourceClaimStatuses": [{"name": "dev", "resourceClaimName": "p-dev"}]}}


def test_a_second_pod_wanting_the_same_devices_is_refused_and_fits_once_the_first_is_deleted(
    service: CustomScheduler,
) -> None:
    service.mirror.on_dra("resourceslices", "SYNC", [neuron_slice("n1", 2)])
    service.mirror.on_pods("ADDED", pod("a", templates={"dev": "two"}))
    cycle(service)
    watch_claims(service)  # the claim as written, reported back: still held
    service.mirror.on_pods("ADDED", pod("b", templates={"dev": "two"}))
    cycle(service)
    api = server(service)
    assert api.bindings() == {"a": "n1"}
    assert api.refusals("b") == ["0/2 nodes are available: 2 cannot allocate all claims."]

    bound = pod("a", templates={"dev": "two"})
    bound["spec"]["nodeName"] = "n1"
    service.mirror.on_pods("DELETED", bound)
    assert "a-dev" not in api.claims, "the claim made for the pod is deleted with it (finalizer removed first)"
    watch_claims(service)
    cycle(service)
    assert api.bindings() == {"a": "n1", "b": "n1"}
    assert api.devices("b-dev") == ["neuron-0", "neuron-1"]


def test_a_named_claim_shared_by_two_pods_stays_allocated_until_the_last_goes(service: CustomScheduler) -> None:
    api = server(service)
    api.claims["shared"] = {**claim("shared", claim_spec(exactly("devs", "neuron", 1))), "status": {}}
    api.claims["shared"]["metadata"]["resourceVersion"] = "1"
    watch_claims(service)
    for name in ("a", "b"):
        service.mirror.on_pods("ADDED", pod(name, claims={"dev": "shared"}))
    cycle(service)
    assert api.bindings() == {"a": "n1", "b": "n1"}
    assert [c["name"] for c in api.claims["shared"]["status"]["reservedFor"]] == ["a", "b"]
    watch_claims(service)
    service.mirror.on_pods("DELETED", {**pod("a", claims={"dev": "shared"}), "spec": {"nodeName": "n1"}})
    assert api.claims["shared"]["status"]["reservedFor"] == [{"resource": "pods", "name": "b", "uid": "uid-b"}]
    assert api.devices("shared") == ["neuron-0"]
    watch_claims(service)
    service.mirror.on_pods("DELETED", {**pod("b", claims={"dev": "shared"}), "spec": {"nodeName": "n1"}})
    assert api.claims["shared"]["status"] == {}, "deallocated once nothing reserves it"
    assert api.claims["shared"]["metadata"]["finalizers"] == []


@pytest.mark.parametrize("lost", ["POST", "PUT /status"])
def test_a_write_whose_answer_was_lost_is_read_back_and_not_repeated(service: CustomScheduler, lost: str) -> None:
    api = server(service)
    api.lose.add(lost)
    service.mirror.on_pods("ADDED", pod("p", templates={"dev": "two"}))
    cycle(service)
    assert api.bindings() == {"p": "n1"}
    assert api.devices("p-dev") == ["neuron-0", "neuron-1"]
    assert len(api.claims["p-dev"]["status"]["reservedFor"]) == 1
    assert sum(1 for m, p, _ in api.writes if m == "POST" and p == CLAIMS) == 1


def allocated_claim(name: str, owner: str, node: str, *devices: int) -> dict[str, Any]:
    """A template claim as kubegpu writes it for pod `owner` (its owner, finalizer, reservation): allocated
    `neuron-<i>` for each of `devices` on `node`."""
    results = [{"request": "devs", "driver": NEURON, "pool": node, "device": f"neuron-{i}"} for i in devices]
    on_node = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    made = {
        **claim(name, claim_spec(exactly("devs", "neuron", len(devices)))),
        "status": {
            "allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [on_node]}},
            "reservedFor": [{"resource": "pods", "name": owner, "uid": f"uid-{owner}"}],
        },
    }
    made["metadata"].update(
        resourceVersion="7",
        finalizers=[FINALIZER],
        ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": f"uid-{owner}", "controller": True}],
    )
    return made


def test_a_restarted_scheduler_keeps_the_claim_it_allocated_for_the_pod(service: CustomScheduler) -> None:
    api = server(service)
    api.claims["p-dev"] = allocated_claim("p-dev", "p", "n2", 2, 3)
    watch_claims(service)  # what the new process lists: its claim, allocated before the Binding was written
    service.mirror.on_pods("ADDED", pod("p", templates={"dev": "two"}))
    service.mirror.on_pods("ADDED", pod("q", templates={"dev": "two"}))
    cycle(service)
    assert api.bindings()["p"] == "n2", "the pod goes where its claim's devices are"
    assert api.devices("p-dev") == ["neuron-2", "neuron-3"]
    assert not [p for m, p, _ in api.writes if p == f"{CLAIMS}/p-dev/status"], "nothing rewritten"
    assert api.devices("q-dev") == ["neuron-0", "neuron-1"], "another pod never gets the claim's devices"


def test_a_claim_of_the_pods_name_made_for_another_pod_is_refused_by_name(service: CustomScheduler) -> None:
    api = server(service)
    api.claims["p-dev"] = claim("p-dev", claim_spec(exactly("devs", "neuron", 2)))
    api.claims["p-dev"]["metadata"].update(
        resourceVersion="3",
        ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-old", "controller": True}],
    )
    watch_claims(service)
    service.mirror.on_pods("ADDED", pod("p", templates={"dev": "two"}))
    cycle(service)
    assert api.bindings() == {}
    assert api.refusals("p") == ['0/2 nodes are available: resourceclaim "p-dev" was not created for the pod.']
    assert "status" not in api.claims["p-dev"], "the other pod's claim is left alone"


def test_a_claim_allocated_elsewhere_meanwhile_is_respected_and_the_pod_tried_again(service: CustomScheduler) -> None:
    api = server(service)
    api.claims["shared"] = {**claim("shared", claim_spec(exactly("devs", "neuron", 1))), "status": {}}
    api.claims["shared"]["metadata"]["resourceVersion"] = "1"
    watch_claims(service)
    original = api._claims

    def other_scheduler_first(method: str, path: str, body: Any) -> Any:
        if method == "PUT" and path.endswith("/status") and "status" in body:
            stored = api.claims["shared"]
            if not stored.get("status"):  # another scheduler allocated it a moment before
                result = {"request": "devs", "driver": NEURON, "pool": "n2", "device": "neuron-3"}
                on_n2 = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
                stored["status"] = {
                    "allocation": {"devices": {"results": [result]}, "nodeSelector": {"nodeSelectorTerms": [on_n2]}},
                    "reservedFor": [{"resource": "pods", "name": "x", "uid": "uid-x"}],
                }
                api._bump(stored)
        return original(method, path, body)

    api._claims = other_scheduler_first  # type: ignore[method-assign]
    service.mirror.on_pods("ADDED", pod("p", claims={"dev": "shared"}))
    cycle(service)
    assert api.bindings() == {}
    assert api.devices("shared") == ["neuron-3"], "the other allocation stands"
    assert [c["name"] for c in api.claims["shared"]["status"]["reservedFor"]] == ["x"]
    assert any("allocated other devices meanwhile" in m for m in api.refusals("p"))
    watch_claims(service)  # the other allocation, as the informer reports it
    cycle(service)
    assert api.bindings() == {"p": "n2"}, "tried again, it shares the claim where it is allocated"


def test_an_older_copy_of_a_claim_being_written_never_frees_its_devices(service: CustomScheduler) -> None:
    service.mirror.on_dra("resourceslices", "SYNC", [neuron_slice("n1", 2)])
    api = server(service)
    held: list[Any] = []
    service.binder.submit = held.append  # type: ignore[method-assign,assignment]  # the writes stay on their way
    service.mirror.on_pods("ADDED", pod("a", templates={"dev": "two"}))
    cycle(service)
    made = {**claim("a-dev", claim_spec(exactly("devs", "neuron", 2))), "status": {}}
    made["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "a", "uid": "uid-a", "controller": True}]
    service.mirror.on_dra("resourceclaims", "ADDED", made)  # created, its status not written yet
    service.mirror.on_dra("resourceclaims", "SYNC", [])  # a relist from before the claim was made
    service.mirror.on_pods("ADDED", pod("b", templates={"dev": "two"}))
    cycle(service)
    for coroutine in held:  # the writes land
        asyncio.run(coroutine)
    assert api.bindings() == {"a": "n1"}
    assert api.refusals("b") == ["0/2 nodes are available: 2 cannot allocate all claims."], "not given a's devices"


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        pytest.param(404, "the API server does not serve resource.k8s.io/v1 (DRA, Kubernetes 1.34+)", id="absent"),
        pytest.param(403, "this scheduler may not list resource.k8s.io/v1 objects (403 Forbidden)", id="forbidden"),
    ],
)
def test_without_dra_pods_with_claims_are_told_why_and_the_others_still_bind(
    service: CustomScheduler, caplog: pytest.LogCaptureFixture, answer: int, problem: str
) -> None:
    class Client:
        asked = 0

        def get(self, path: str, **params: Any) -> Any:
            Client.asked += 1
            if answer == 404:
                raise ApiError(404, "NotFound", path)
            if path == "/apis/resource.k8s.io":
                return {
                    "kind": "APIGroup",
                    "name": "resource.k8s.io",
                    "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}],
                }
            if path == "/apis/resource.k8s.io/v1":
                return {"resources": [{"name": kind} for kind in DRA_KINDS]}
            raise ApiError(403, "Forbidden", path)

    mirror = service.mirror
    mirror.client = Client()  # type: ignore[assignment]
    for synced in mirror.dra_synced.values():
        synced.clear()
    thread = threading.Thread(target=mirror.watch_dra_versions, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not all(s.is_set() for s in mirror.dra_synced.values()) and time.monotonic() < deadline:
        mirror.apply_events(0.05)
    mirror.stop.set()
    thread.join(5)
    assert mirror.dra_problem == problem
    status, body = answer_health("/readyz", mirror, service.metrics)  # type: ignore[misc]
    assert status == 200
    assert "the API server serves no version of resourceclaims that kubegpu reads" in body["missing"]
    assert caplog.text.count(problem) == 1

    mirror.on_pods("ADDED", pod("with-claims", templates={"dev": "two"}))
    plain = pod("plain")
    plain["spec"].pop("resourceClaims")
    plain["spec"]["containers"][0]["resources"].pop("claims")
    mirror.on_pods("ADDED", plain)
    cycle(service)
    api = server(service)
    assert api.bindings() == {"plain": "n1"}
    assert api.refusals("with-claims") == [f"the pod's resource claims cannot be allocated: {problem}"]


def test_a_bound_pod_counted_after_a_restart_releases_its_claim_when_deleted(service: CustomScheduler) -> None:
    service.mirror.on_pods("ADDED", pod("p", templates={"dev": "two"}))
    cycle(service)
    api = server(service)
    assert api.bindings() == {"p": "n1"}
    # A new process: the bound pod is listed before its claim (the two informers race).
    fresh = CustomScheduler(
        None,  # type: ignore[arg-type]
        api,  # type: ignore[arg-type]
        Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), signing_key=KEY),
        name="kubegpu",
    )
    bound = {**pod("p", templates={"dev": "two"}), "spec": {**pod("p", templates={"dev": "two"})["spec"]}}
    bound["spec"]["nodeName"] = "n1"
    fresh.mirror.on_nodes("SYNC", [node_manifest(n) for n in ("n1", "n2")])
    fresh.mirror.on_namespaces("SYNC", [])
    fresh.mirror.on_pods("SYNC", [bound])
    fresh.mirror.on_dra("deviceclasses", "SYNC", [NEURON_CLASS])
    fresh.mirror.on_dra("resourceslices", "SYNC", [neuron_slice("n1", 4), neuron_slice("n2", 4)])
    watch_claims(fresh)
    fresh.mirror.on_pods("DELETED", bound)
    assert "p-dev" not in api.claims, "its claim released and deleted by the new process"


class Listing:
    """What a new leader's fresh lists read: the pods and claims the API server holds now."""

    def __init__(self, pods: list[dict[str, Any]], claims: list[dict[str, Any]]) -> None:
        self.answers = {"/api/v1/pods": pods, "/apis/resource.k8s.io/v1/resourceclaims": claims}
        self.lists: list[str] = []

    def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists.append(path)
        return copy.deepcopy(self.answers[path]), "42"


def test_a_new_leader_counts_the_claims_the_previous_leader_allocated_before_it_decides(
    service: CustomScheduler,
) -> None:
    """The previous leader allocated `a-dev` (both of n1's devices) and bound `a` there; the standby's watches
    delivered neither. Before deciding, the new leader lists the pods and the claims afresh, so `b` is refused
    instead of being given the devices `a` holds."""
    service.mirror.on_dra("resourceslices", "SYNC", [neuron_slice("n1", 2)])
    api = server(service)
    allocated = allocated_claim("a-dev", "a", "n1", 0, 1)
    bound = pod("a", templates={"dev": "two"})
    bound["spec"]["nodeName"] = "n1"
    bound["status"] = {"phase": "Pending", "resourceClaimStatuses": [{"name": "dev", "resourceClaimName": "a-dev"}]}
    waiting = pod("b", templates={"dev": "two"})
    listing = Listing([bound, waiting], [allocated])
    service.mirror.client = listing  # type: ignore[assignment]
    service.leader_elect = True
    service.leadership = Leadership(time.monotonic() + 60)
    service.mirror.on_pods("ADDED", waiting)  # the standby's view: `b` waits, `a` and its claim not delivered yet
    service.mirror.ready = lambda: True  # type: ignore[method-assign]
    assert not service._may_decide()
    service.mirror.apply_events(10.0)  # the fresh lists, once the catch-up thread has them
    assert sorted(listing.lists) == ["/api/v1/pods", "/apis/resource.k8s.io/v1/resourceclaims"]
    assert service._may_decide()
    cycle(service)
    assert "b" not in api.bindings(), "the new leader gave `b` the devices the previous leader allocated to `a`"
    assert api.refusals("b") == ["0/2 nodes are available: 2 cannot allocate all claims."]


def b_placed_after_catching_up(service: CustomScheduler, listing: type[ListingWhileEventsCome], *, named: bool) -> None:
    """`a` holds both of n1's devices through `a-dev` (made from a template for `a`, or named by it) and `b` waits;
    a new leader catches up through `listing`'s fresh lists, racing what the informers deliver meanwhile, and its
    first cycle must bind `b` to n1: `a` and `a-dev` are gone."""
    service.mirror.on_dra("resourceslices", "SYNC", [neuron_slice("n1", 2)])
    api = server(service)
    allocated = allocated_claim("a-dev", "a", "n1", 0, 1)
    if named:
        del allocated["metadata"]["ownerReferences"]
        bound = pod("a", claims={"dev": "a-dev"})
    else:
        bound = pod("a", templates={"dev": "two"})
    bound["spec"]["nodeName"] = "n1"
    bound["status"] = {"phase": "Running", "resourceClaimStatuses": [{"name": "dev", "resourceClaimName": "a-dev"}]}
    waiting = pod("b", templates={"dev": "two"})
    service.mirror.on_dra("resourceclaims", "ADDED", copy.deepcopy(allocated))
    service.mirror.on_pods("ADDED", copy.deepcopy(bound))
    service.mirror.on_pods("ADDED", waiting)
    service.mirror.client = listing([bound, waiting], [allocated], service.mirror)  # type: ignore[assignment]
    service.leader_elect = True
    service.leadership = Leadership(time.monotonic() + 60)
    service.mirror.ready = lambda: True  # type: ignore[method-assign]
    assert not service._may_decide()
    deadline = time.monotonic() + 10
    while not service._may_decide() and time.monotonic() < deadline:
        service.mirror.apply_events(0.5)
    assert service._may_decide()
    cycle(service)
    assert api.bindings().get("b") == "n1", api.refusals("b")


class ListingWhileEventsCome(Listing):
    """Fresh lists read from etcd while the informers deliver something (`meanwhile`), which the loop applies before
    the first list's answer."""

    def __init__(self, pods: list[dict[str, Any]], claims: list[dict[str, Any]], mirror: Any) -> None:
        super().__init__(pods, claims)
        self.mirror = mirror

    def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
        listed = super().list(path, **params)
        if len(self.lists) == 1:  # while the first list's answer was on its way
            self.meanwhile()
        return listed

    def meanwhile(self) -> None:
        raise NotImplementedError


class RacingListing(ListingWhileEventsCome):
    """The watches deliver `a`'s and its claim's deletion."""

    def meanwhile(self) -> None:
        pods, claims = self.answers["/api/v1/pods"], self.answers["/apis/resource.k8s.io/v1/resourceclaims"]
        self.mirror.post(self.mirror.on_pods, "DELETED", copy.deepcopy(pods[0]))
        self.mirror.post(self.mirror.on_dra, "resourceclaims", "DELETED", copy.deepcopy(claims[0]))


def test_a_claim_deleted_while_the_new_leader_lists_is_not_brought_back(service: CustomScheduler) -> None:
    """`a` held both of n1's devices through `a-dev`; `a` and its claim are deleted while the new leader's fresh
    lists, read before, are on their way, and the loop applies the deletions first. The older claim list must not
    allocate `a-dev` again: no later event of it comes, and n1's devices would be held by nobody for good. Before:
    `b` was refused "cannot allocate all claims" though n1 is empty."""
    b_placed_after_catching_up(service, RacingListing, named=False)  # the deletions, then the fresh lists


class RelistingListing(ListingWhileEventsCome):
    """The informers relist after their watches dropped, `a` and `a-dev` deleted in between."""

    def meanwhile(self) -> None:
        self.mirror.post(self.mirror.on_pods, "SYNC", copy.deepcopy(self.answers["/api/v1/pods"][1:]))
        self.mirror.post(self.mirror.on_dra, "resourceclaims", "SYNC", [])


@pytest.mark.parametrize("named", [False, True], ids=["template-claim", "named-claim"])
def test_a_claim_an_informer_relist_showed_deleted_is_not_brought_back_by_the_older_fresh_list(
    service: CustomScheduler, named: bool
) -> None:
    """As above, but `a` and `a-dev` (made from a template for `a`, or named by it) were deleted while the watches
    were down, and the informers' relists (not DELETED events) say so while the new leader's fresh lists, read
    before, are on their way. The older lists must not bring them back: no event of them will ever come. Before:
    `b` was refused "cannot allocate all claims" though n1 is empty."""
    b_placed_after_catching_up(service, RelistingListing, named=named)  # the relists, then the fresh lists


def foreign_claim(name: str, *devices: int, node: str = "n1") -> dict[str, Any]:
    """A claim kube-scheduler allocated for its pod `x` (1.34, the DRAConsumableCapacity gate on): its spec asks what
    kubegpu does not implement (`distinctAttribute`), its allocation names `neuron-<i>` of `node`."""
    spec = claim_spec(
        exactly("devs", "neuron", len(devices) or 1),
        constraints=[{"requests": ["devs"], "distinctAttribute": f"{NEURON}/index"}],
    )
    made = claim(name, spec)
    if devices:
        on_node = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        results = [{"request": "devs", "driver": NEURON, "pool": node, "device": f"neuron-{i}"} for i in devices]
        made["status"] = {
            "allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [on_node]}},
            "reservedFor": [{"resource": "pods", "name": "x", "uid": "uid-x"}],
        }
    made["metadata"]["resourceVersion"] = "5"
    return made


def test_devices_of_a_claim_kubegpu_cannot_read_are_never_allocated_again(service: CustomScheduler) -> None:
    """kube-scheduler allocated n1's two devices to a claim whose spec kubegpu cannot read: the claim was ignored
    whole, its devices counted as free, and kubegpu's pod was given the same two devices (held twice; the driver
    refuses the second pod at its start). Its allocation still holds them: the pod waits until the claim goes."""
    api = server(service)
    service.mirror.on_dra("resourceslices", "SYNC", [neuron_slice("n1", 2)])
    api.claims["other"] = foreign_claim("other", 0, 1)
    watch_claims(service)
    service.mirror.on_pods("ADDED", pod("p", templates={"dev": "two"}))
    cycle(service)
    assert api.bindings() == {}
    assert api.refusals("p") == ["0/2 nodes are available: 2 cannot allocate all claims."]
    del api.claims["other"]
    watch_claims(service)
    cycle(service)
    assert api.bindings() == {"p": "n1"}
    assert api.devices("p-dev") == ["neuron-0", "neuron-1"]


def test_a_pod_naming_a_claim_kubegpu_cannot_read_is_told_why(service: CustomScheduler) -> None:
    """Not `resourceclaim "odd" not found`, which sends its owner looking for a claim that exists: what is wrong."""
    api = server(service)
    api.claims["odd"] = foreign_claim("odd")
    watch_claims(service)
    service.mirror.on_pods("ADDED", pod("p", claims={"dev": "odd"}))
    cycle(service)
    assert api.bindings() == {}
    (reason,) = api.refusals("p")
    assert 'resourceclaim "odd" cannot be read' in reason and "distinctAttribute" in reason, reason


def test_a_pod_sharing_an_allocated_claim_kubegpu_cannot_read_goes_where_it_is_allocated(
    service: CustomScheduler,
) -> None:
    api = server(service)
    api.claims["shared"] = foreign_claim("shared", 3, node="n2")
    watch_claims(service)
    service.mirror.on_pods("ADDED", pod("p", claims={"dev": "shared"}))
    cycle(service)
    assert api.bindings() == {"p": "n2"}
    assert [c["name"] for c in api.claims["shared"]["status"]["reservedFor"]] == ["x", "p"]


def test_a_pod_naming_a_template_kubegpu_cannot_read_is_told_why(service: CustomScheduler) -> None:
    odd = template("odd", claim_spec(exactly("devs", "neuron", 33)))  # upstream allocates at most 32 devices
    service.mirror.on_dra("resourceclaimtemplates", "ADDED", odd)
    service.mirror.on_pods("ADDED", pod("p", templates={"dev": "odd"}))
    cycle(service)
    api = server(service)
    assert api.bindings() == {} and "p-dev" not in api.claims
    (reason,) = api.refusals("p")
    assert 'resourceclaimtemplate "odd" cannot be read' in reason and "count" in reason, reason


def _namespace(name: str, labelled: bool) -> dict[str, Any]:
    labels = {"resource.kubernetes.io/admin-access": "true"} if labelled else {}
    return {"metadata": {"name": name, "labels": labels}}


def test_admin_access_waits_for_the_namespace_label_and_stops_when_it_is_taken_off(service: CustomScheduler) -> None:
    # The namespaces informer lists every namespace: one that loses the label arrives MODIFIED, one deleted
    # DELETED. Where none has the label, no namespace has admin access.
    api = server(service)
    agent = claim_spec(exactly("all", "neuron", mode="All"))
    agent["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    service.mirror.on_dra("resourceclaimtemplates", "ADDED", template("watch", agent))
    service.mirror.on_pods("ADDED", pod("a", templates={"dev": "two"}))
    service.mirror.on_pods("ADDED", pod("agent", templates={"dev": "watch"}))
    cycle(service)
    assert api.bindings() == {"a": "n1"}
    assert api.refusals("agent") == [
        "0/2 nodes are available: request all: admin access to devices requires the "
        "`resource.kubernetes.io/admin-access: true` label on the containing namespace."
    ]

    service.mirror.on_namespaces("SYNC", [_namespace("default", True)])
    cycle(service)
    assert api.bindings()["agent"] in ("n1", "n2")
    results = api.claims["agent-dev"]["status"]["allocation"]["devices"]["results"]
    assert results and all(r["adminAccess"] is True for r in results)
    if api.bindings()["agent"] == "n1":
        assert "neuron-0" in [r["device"] for r in results], "a device the pod a holds"

    # The label taken off: no admin access from then on.
    service.mirror.on_namespaces("MODIFIED", _namespace("default", False))
    service.mirror.on_pods("ADDED", pod("agent2", templates={"dev": "watch"}))
    cycle(service)
    assert "agent2" not in api.bindings()
    assert "admin access to devices requires" in api.refusals("agent2")[-1]

    # Deleted: gone from the set whatever labels the event's object shows.
    service.mirror.on_namespaces("MODIFIED", _namespace("default", True))
    service.mirror.on_namespaces("DELETED", _namespace("default", True))
    service.mirror.on_pods("ADDED", pod("agent3", templates={"dev": "watch"}))
    cycle(service)
    assert "agent3" not in api.bindings()
    assert "admin access to devices requires" in api.refusals("agent3")[-1]
