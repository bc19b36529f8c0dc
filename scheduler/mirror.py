"""The cluster as kubegpu sees it: informers feeding one engine, shared by both live front-ends.

Informers (`kubegpu.kube.client.Informer`) list and watch Nodes and Pods, and, where asked, the advertisers' node
Leases, PodDisruptionBudgets, PersistentVolumeClaims and PersistentVolumes; their threads only enqueue. Budgets are
read in the version the API server serves (`policy/v1` where it does, from 1.21; else `policy/v1beta1`, which 1.25
removed), found in its discovery document first (`kubegpu.kube.discovery`). The thread
that owns the engine applies what they report (`apply_events`) under `lock`, which the extender's HTTP handlers take
too:

* nodes become engine nodes (an inventory kubegpu cannot read is ignored with an error log, the node kept); a node
  change wakes the pending pods only when it can make one fit (`Engine.node_change_may_help`: not a pulled image
  nor an annotation, which only scores read);
* a bound pod is counted with the devices it holds (`_assume`): on start that rebuilds the device ledger from the
  `kubegpu.io/allocation` annotations of bound, running pods, so a restarted scheduler never hands out a device a
  live pod holds. Only a verified allocation holds devices; a refused one gets an `AllocationRefused` Event, once;
* a pod deleted or finished releases what it held;
* a pod that waits for a node goes to the front-end's `PendingPods`: the custom scheduler's queue, or the
  extender's record of pending pods; either is told when the cluster changed in a way that may help them. A pod
  with scheduling gates (`kubegpu.scheduler.gates`) is kept out of them, counted as gated, until an update removes
  its last gate (the engine's PreEnqueue rules, `Engine.pre_enqueue`: SchedulingGates unless the profile turns it off);
* claims and volumes (`watch_volumes`) become the engine's VolumeBinding records: a claim's volume once it is
  Bound, a volume's required node affinity; a change to either wakes the pending pods. A claim or volume kubegpu
  cannot read is left out with a warning, so only the pods that name it are refused;
* PodGroups (`watch_podgroups`; scheduler-plugins' `scheduling.x-k8s.io/v1alpha1`, a CRD) are read where the API
  server serves them, found by discovery, which is asked again every `PODGROUP_RECHECK` seconds while it does not
  (the CRD may be installed after the scheduler starts): meanwhile an error says so once, `/readyz` names the API,
  and gangs are read from Kueue's labels alone. Each change goes to the front-end's `PendingPods.group_changed`;
* DRA's DeviceClasses, ResourceSlices, ResourceClaimTemplates and ResourceClaims (`watch_dra`; `resource.k8s.io/v1`)
  become the engine's `DraBook` where discovery finds all four (rechecked every `DRA_RECHECK` seconds while it does
  not, or while this scheduler may not list them): meanwhile a warning says why once, `/readyz` names them, and
  `dra_problem` says why pods with claims wait. A claim the engine holds for a pod whose writes are still on their
  way keeps the engine's allocation and reservation against an older copy from the watch (`_with_own_reservations`),
  so its devices are never free in between; a different allocation from the server wins (the write then fails);
* Namespaces become the engine's namespace labels: a pod (anti-)affinity term's `namespaceSelector` reads them,
  and the `resource.kubernetes.io/admin-access` label says where DRA claims may ask for admin access. A change wakes
  the pending pods; until their first list `/readyz` names them and nothing is decided (kube-scheduler waits the
  same), and a Namespace kubegpu cannot read is left out with a warning;
* Services, ReplicationControllers, ReplicaSets and StatefulSets (`watch_owners`, when the profile has default
  spread constraints) become the engine's owners: their selectors give the pods they select that set no
  `topologySpreadConstraints` kube-scheduler's default spread over hosts and zones (`kubegpu.scheduler.owners`).
  One kubegpu cannot read selects nothing, with a warning: only its pods lose their default spread.

One object that raises costs only itself: an error log, `kubegpu_scheduler_internal_errors_total{stage}` and, for a
pod, a `KubegpuInternalError` Event; a tenant's pod (or claim) must not be able to stop scheduling for everyone.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace
from functools import partial
from typing import Any, Protocol, TypeVar

from kubegpu.core import dra
from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    FOREIGN_DEVICES_KEY,
    AllocationRecord,
    AnnotationError,
    decode_allocation,
    decode_foreign_devices,
)
from kubegpu.core.errors import InputError, shorten
from kubegpu.core.manifests import bound_pod_request, node_info, pod_request
from kubegpu.core.models import NodeInfo, PodRequest
from kubegpu.core.status import Code
from kubegpu.core.text import safe_text
from kubegpu.kube import discovery
from kubegpu.kube.client import ApiError, Informer, KubeClient
from kubegpu.scheduler import liveness, objects, podgroups
from kubegpu.scheduler.binder import Binder
from kubegpu.scheduler.dra import HeldClaim
from kubegpu.scheduler.engine import Engine, Placement
from kubegpu.scheduler.gangcuts import preemption_mark
from kubegpu.scheduler.gangstatus import GangMembers, gang_of, member_state
from kubegpu.scheduler.health import Metrics
from kubegpu.scheduler.podgroups import PodGroup
from kubegpu.scheduler.preemption import Budget

__all__ = ["ClusterMirror", "PendingPods"]

log = logging.getLogger("kubegpu.scheduler")

FINISHED = frozenset({"Succeeded", "Failed"})


def sizes_of(obj: dict[str, Any]) -> tuple[object, ...]:
    """What a pod's requests are computed from, raw (`pod_request`): its containers' and the pod-level resources,
    the resources the kubelet reports per container after an in-place resize, and the resize condition. Two equal
    answers give equal requests, so a bound pod's update is parsed again only when this changed."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}

    def each(items: Any, *fields: str) -> list[object]:
        return [tuple(i.get(f) for f in fields) for i in items or () if isinstance(i, dict)]

    return (
        each(spec.get("containers"), "resources"),
        each(spec.get("initContainers"), "resources", "restartPolicy"),
        spec.get("resources"),
        spec.get("overhead"),
        each(status.get("containerStatuses"), "name", "resources", "allocatedResources"),
        each(status.get("initContainerStatuses"), "name", "resources", "allocatedResources"),
        [
            c.get("reason")
            for c in status.get("conditions") or ()
            if isinstance(c, dict) and c.get("type") == "PodResizePending"
        ],
    )


# Where each owner kind is listed and watched (`watch_owners`).
OWNER_PATHS = {
    "Service": "/api/v1/services",
    "ReplicationController": "/api/v1/replicationcontrollers",
    "ReplicaSet": "/apis/apps/v1/replicasets",
    "StatefulSet": "/apis/apps/v1/statefulsets",
}
# The PodDisruptionBudget versions kubegpu reads, most preferred first (the two have the fields preemption reads).
BUDGET_VERSIONS = ("v1", "v1beta1")
BUDGETS = "poddisruptionbudgets"
# scheduler-plugins' PodGroups: the group and the versions kubegpu reads, and how often discovery is asked again while
# the API server serves none (the CRD may be installed later).
PODGROUP_GROUP, PODGROUP_VERSIONS, PODGROUPS = "scheduling.x-k8s.io", ("v1alpha1",), "podgroups"
PODGROUP_RECHECK = 60.0
# How often the plugins' node digests are asked again with no Node update (`ClusterMirror.recheck_digests`): HAMi's
# handshake goes stale 60 s after it was requested, and HAMi's own scheduler looks every 30 s.
DIGEST_RECHECK = 30.0
LEASE_GROUP = "coordination.k8s.io"
GATE_LABELS = 32  # gate names with a series of their own in kubegpu_scheduler_gated_pods
OTHER_GATES = "(other)"
T = TypeVar("T")
# DRA (`resource.k8s.io/v1`, 1.34): the collections the custom scheduler lists and watches, where discovery finds them
# all (asked again every `DRA_RECHECK` seconds while it does not: a cluster may be upgraded, a CRD installed).
DRA_GROUP, DRA_VERSIONS = "resource.k8s.io", ("v1",)
DRA_KINDS = ("deviceclasses", "resourceslices", "resourceclaimtemplates", "resourceclaims")
CLAIMS_KIND = DRA_KINDS[3]  # the collection a new leader lists afresh beside the pods (`caught_up`)
DRA_RECHECK = 60.0
STALL = 30.0  # seconds without a beat of the loop applying informer events after which /healthz fails
BATCH = 2000  # informer events applied under one taking of the lock


class PendingPods(Protocol):
    """What a front-end does with the pods that wait for a node: the custom scheduler queues them
    (`queue.SchedulingQueue`), the extender remembers them for its verbs (`extender.UnboundPods`)."""

    def observe(self, key: str, request: PodRequest, version: str, *, deleting: bool, held: bool) -> bool:
        """A pod without a node, as the informer reports it at resourceVersion `version` (`held`: the engine
        already counts it). False: the front-end has nothing to do with it, and the mirror drops it."""
        ...

    def binding(self, key: str) -> str | None:
        """The UID of the pod whose Binding the front-end is writing under this key, if any."""
        ...

    def drop(self, key: str) -> None:
        """The pod no longer waits (bound, deleted, finished, or not this front-end's)."""
        ...

    def keep_only(self, live: set[str]) -> None:
        """After a relist: only these pods exist."""
        ...

    def wake(self) -> None:
        """The cluster changed in a way that may help any pod (a node added or changed, a pod's resources freed)."""
        ...

    def wake_for(self, added: PodRequest) -> None:
        """A pod now counts on a node (pods its affinity or spread selects may fit now)."""
        ...

    def answers_for(self, scheduler_name: object) -> bool:
        """Whether kubegpu tells a pod naming this scheduler that it cannot be read (else its own scheduler does)."""
        ...

    def wake_group(self, key: str) -> None:
        """The PodGroup `namespace/name` was added, changed or deleted: its waiting members are judged again."""
        ...


class ClusterMirror:
    """Informers into one engine. `binder` writes the Events the mirror reports; `pending` is the front-end's."""

    def __init__(
        self,
        client: KubeClient,
        engine: Engine,
        binder: Binder,
        pending: PendingPods,
        *,
        leases: liveness.NodeLeases | None = None,
        watch_budgets: bool = False,
        watch_volumes: bool = False,
        watch_owners: bool = False,
        watch_podgroups: bool = False,
        needs_leases: bool = False,
        watch_dra: bool = False,
        follow_nominations: bool = False,
        claims_released: Callable[[PodRequest, list[HeldClaim]], None] | None = None,
        bound_leaving: Callable[[PodRequest, str, bool, bool | None], None] | None = None,
        nominated: Callable[[PodRequest, str], None] | None = None,
    ) -> None:
        self.client = client
        # The extender's: kube-scheduler nominates its preemptors (`status.nominatedNodeName`) and keeps the room
        # their victims free from pods of lower priority only in its own filters, which do not count a GPU share
        # (`ignoredByScheduler`). The engine holds the node for such a pod as the custom scheduler's own
        # preemption does (`Engine.nominate`), until the pod binds, leaves, or its nomination is cleared.
        self.follow_nominations = follow_nominations
        # The extender's `GangCuts`: told of each bound pod being deleted, finished or gone, with what its deletion says
        # of itself (`gangcuts.preemption_mark`), and of each nomination followed, so that it evicts the rest of a
        # gang kube-scheduler's preemption cut.
        self.bound_leaving = bound_leaving
        self.nominated = nominated
        self.engine = engine
        self.binder = binder
        self.metrics: Metrics = binder.metrics
        self.pending = pending
        # The engine belongs to the thread applying events; other threads (the extender's HTTP handlers) take this.
        self.lock = threading.RLock()
        self.events: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]]] = queue.Queue()
        self.stop = threading.Event()
        engine.plugins.on_hook_failure.append(lambda e: self.metrics.plugin_failures.labels(e.plugin, e.hook).inc())
        engine.plugins.on_slow_hook.append(
            lambda plugin, hook, _: self.metrics.plugin_slow_calls.labels(plugin, hook).inc()
        )
        self.nodes_synced = threading.Event()
        self.pods_synced = threading.Event()
        self.heartbeat = time.monotonic()
        # pod key -> (its uid, why it is ignored or its allocation holds no devices): one Event per pod and reason.
        self._refused: dict[str, tuple[str, str]] = {}
        # pod key -> (its uid, why it was read without some fields, those fields): a bound pod counted in part, logged
        # once, and read again without those fields first (`bound_pod_request`).
        self._partly: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        # Pod key -> what the request the engine or the queue holds for it was computed from (`sizes_of`), to see an
        # in-place resize (1.33+): a bound pod's, and this front-end's pending pod's (the request its cycle decides
        # on, so the event of its own Binding is compared with it, not parsed whole again). Set at each parse that
        # the engine or the queue keeps; forgotten at `release`.
        self._sizes: dict[str, tuple[object, ...]] = {}
        # Pod key -> how a pod bound to a Node that was deleted held its node: the pods keep running (a kubelet
        # registers its node again; an operator deleted the object), and kube-scheduler's cache keeps a deleted
        # node's pods until they leave. Counted again when a Node of that name comes back; forgotten when the pod
        # leaves (deleted, finished, a relist without it) or another pod takes its name. Bounded by the pods that
        # exist. A pod bound to a Node not listed yet (this replica's pod watch ahead of its node watch, a Node
        # kubegpu cannot read) waits here too, in `_uncounted`: counted (`_assume`) when its Node is listed, so it
        # is counted once, as a pod met bound, not before its node, which the engine refuses.
        self._orphans: dict[str, Placement] = {}
        self._uncounted: set[str] = set()
        # The orphans whose allocation only an `--allocation-verify-key-file` key verifies: they run on, their
        # containers verified again at each restart, so the old key is still needed (`pods_on_verify_keys`).
        self._orphans_on_verify_keys: set[str] = set()
        # This front-end's pods held back at PreEnqueue (their scheduling gates), with the reason.
        self.gated: dict[str, str] = {}
        # Per gate name (tenants name gates: at most `GATE_LABELS` names get a series of their own), the gated pods
        # waiting on it, for `kubegpu_scheduler_gated_pods{gate}`.
        self._per_gate: dict[str, int] = {}
        self._gate_labels: dict[str, tuple[str, ...]] = {}  # gated pod key -> the labels it counts under
        self.metrics.pending.labels("gated").set(0)
        # PodDisruptionBudgets by namespace/name: the custom scheduler's preemptions honour them. The extender does
        # not watch them: kube-scheduler counts the violations of the victims it proposes.
        self.watch_budgets = watch_budgets
        self.budgets: dict[str, Budget] = {}
        self.budgets_synced = threading.Event()
        # The group/version each discovered collection is read in; None: the server serves no version kubegpu reads.
        self.versions: dict[str, str | None] = {}
        # The API server's version (`survey_server`), what is wrong with it (a newer server than kubegpu is verified
        # against), and why it is refused (an older one: the front-end then exits). Leases are surveyed only for a
        # front-end that takes them (leader election sets `needs_leases`, node liveness reads them).
        self.kubernetes: str | None = None
        self.server_version: tuple[int, int] | None = None  # the API server's (major, minor), once asked
        self.server_warnings: list[str] = []
        self.refusal: str | None = None
        self.needs_leases = needs_leases or leases is not None
        self.surveyed: threading.Event | None = None  # set once `survey_server` answered (None: not started)
        self._evicting: set[str] = set()  # victims deleted by a preemption, until their pods are gone
        self.leases = leases  # the advertisers' node Leases (`kubegpu.scheduler.liveness`), None: not judged
        # PersistentVolumeClaims and PersistentVolumes into the engine's VolumeBinding filter, for the custom
        # scheduler. The extender does not watch them: kube-scheduler runs VolumeBinding itself, and binds the claims
        # that wait for their first consumer, which the engine (binding no volume) would refuse.
        self.watch_volumes = watch_volumes
        engine.track_volumes = engine.track_volumes or watch_volumes
        self.claims_synced = threading.Event()
        self.volumes_synced = threading.Event()
        # The owners that give pods their default spread constraints, for the custom scheduler when its profile has
        # them (the extender leaves PodTopologySpread to kube-scheduler); each kind's first list, as for volumes.
        self.watch_owners = watch_owners and engine.spreads_by_owners()
        self.owners_synced = {kind: threading.Event() for kind in OWNER_PATHS} if self.watch_owners else {}
        # scheduler-plugins' PodGroups, where the API server serves them (`watch_podgroup_versions`): by
        # namespace/name, the group's spec or why it cannot be read (its members are refused with that reason).
        self.watch_podgroups = watch_podgroups
        self.podgroups: dict[str, PodGroup | str] = {}
        self.podgroup_uids: dict[str, str] = {}
        # Every gang's members by state, for the PodGroups' status (`gangstatus`); None: not kept.
        self.gang_members: GangMembers | None = GangMembers() if watch_podgroups else None
        self.podgroups_synced = threading.Event()
        # DRA (`watch_dra_versions`): why pods with claims cannot be placed (None: the four collections are read),
        # each collection's first list, the templates' `spec` as written (a claim made from one copies it), and who
        # writes the claims a released pod held (the custom scheduler; None: nobody here writes claims).
        self.watch_dra = watch_dra
        self.dra_problem: str | None = "the DRA collections (resource.k8s.io/v1) are not listed yet"
        self.dra_synced = {kind: threading.Event() for kind in DRA_KINDS} if watch_dra else {}
        self.namespaces_synced = threading.Event()
        self.claim_templates: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.claims_released = claims_released
        self._next_judgement = 0.0
        self._next_digest_check = time.monotonic() + DIGEST_RECHECK
        # A new leader's fresh list of pods (`caught_up`): None until asked for, then set once the loop applied it.
        self._caught_up: threading.Event | None = None
        # What the watches told of pods and claims while those lists were on their way, per list (the keys of those
        # alive, the uids of those deleted or finished): a list may be older, so it neither brings back an object
        # deleted or finished since nor forgets one added since.
        self._since_listing: dict[str, tuple[set[Any], set[str]]] | None = None
        # The uid of each pod the fresh list showed, until the watch delivers an event of that very pod: a lagging
        # watch's events of an older pod of the same name (deleted and made again) are not applied over it.
        self._listed: dict[str, str] = {}

    # -- the loop -------------------------------------------------------------------------------------------------

    def post(self, handler: Callable[..., None], *args: Any) -> None:
        """Have the loop thread run `handler(*args)` under the lock (informer threads, the binder's results)."""
        self.events.put((handler, args))

    def handle(self, item: tuple[Callable[..., None], tuple[Any, ...]]) -> None:
        handler, args = item
        handler(*args)

    def beat(self) -> None:
        self.heartbeat = time.monotonic()

    def apply_events(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for an event (0: do not wait), then apply it and what else is queued, up to
        `BATCH` events, under the lock."""
        try:
            item = self.events.get(timeout=timeout) if timeout else self.events.get_nowait()
            with self.lock:
                self.handle(item)
                for _ in range(BATCH):
                    self.handle(self.events.get_nowait())
        except queue.Empty:
            pass

    def run(self) -> None:
        """The loop of a front-end that only mirrors (the extender): apply events, judge node liveness."""
        while not self.stop.is_set():
            self.beat()
            self.apply_events(0.2)
            with self.lock:
                self.judge_nodes()
                self.recheck_digests()

    def start_informers(self) -> None:
        """Start the informers. Pods are listed while nodes are, and handed over after the nodes' list, so that the
        ledger rebuild finds every bound pod's node."""
        nodes = Informer(self.client, "/api/v1/nodes", self._consume(self.on_nodes), self.stop, "nodes")
        consume = self._consume(self.on_pods)
        pods = Informer(self.client, "/api/v1/pods", consume, self.stop, "pods", after=nodes.synced)
        self.surveyed = threading.Event()  # nothing is scheduled before the server's version is judged
        threading.Thread(target=self.survey_server, name="discovery", daemon=True).start()
        if self.watch_budgets:
            threading.Thread(
                target=self.watch_budget_versions, name="informer-poddisruptionbudgets", daemon=True
            ).start()
        if self.watch_podgroups:
            threading.Thread(target=self.watch_podgroup_versions, name="informer-podgroups", daemon=True).start()
        if self.watch_dra:
            threading.Thread(target=self.watch_dra_versions, name="informer-dra", daemon=True).start()
        if self.watch_volumes:
            consume = self._consume(self.on_claims)
            Informer(self.client, "/api/v1/persistentvolumeclaims", consume, self.stop, "claims").start()
            consume = self._consume(self.on_volumes)
            Informer(self.client, "/api/v1/persistentvolumes", consume, self.stop, "volumes").start()
        consume = self._consume(self.on_namespaces)
        Informer(self.client, "/api/v1/namespaces", consume, self.stop, "namespaces").start()
        for owner in self.owners_synced:
            consume = self._consume(partial(self.on_owners, owner))
            Informer(self.client, OWNER_PATHS[owner], consume, self.stop, owner.lower()).start()
        if self.leases is not None:
            selector = self.leases.selector
            consume = self._consume(self.leases.observe)
            Informer(self.client, self.leases.path, consume, self.stop, "leases", label_selector=selector).start()
        nodes.start()
        pods.start()

    def _consume(self, handler: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
        """An informer's consumer (it runs on the informer's thread): only enqueue."""
        return lambda kind, payload: self.post(handler, kind, payload)

    def ready(self) -> bool:
        """Every informer the engine's answers read has applied its first list."""
        return not self.syncing()

    def syncing(self) -> list[str]:
        """The collections whose first list the engine still waits for (what `/readyz` names), in listing order."""
        waiting = [("nodes", self.nodes_synced), ("pods", self.pods_synced), ("namespaces", self.namespaces_synced)]
        if self.surveyed is not None:
            waiting.insert(0, ("discovery", self.surveyed))
        if self.watch_budgets:
            waiting.append((BUDGETS, self.budgets_synced))
        if self.watch_volumes:
            waiting += [("persistentvolumeclaims", self.claims_synced), ("persistentvolumes", self.volumes_synced)]
        waiting += [(OWNER_PATHS[kind].rsplit("/", 1)[1], synced) for kind, synced in self.owners_synced.items()]
        if self.watch_podgroups:  # a gang is read whole before any of its members is tried
            waiting.append((PODGROUPS, self.podgroups_synced))
        waiting += list(self.dra_synced.items())
        return [name for name, synced in waiting if not synced.is_set()]

    def caught_up(self) -> bool:
        """Whether the pods (and, where DRA is read, the ResourceClaims) listed afresh after this call was first made
        are applied: the first call starts those lists on a thread of its own (without a resourceVersion, so the API
        server reads them from etcd, not from a watch cache) and hands them to the loop as the informers hand their
        lists; True once the loop applied them.

        A replica that has just taken the Lease asks before it decides anything. Its watches may still lag behind the
        Bindings and claim allocations the previous leader made (a half-open connection is read for minutes before it
        times out; in a cluster of several API servers, the one it watches may be behind): counted late, the devices
        those pods hold would be given again. Events the watches deliver after the lists are older or newer: a pod the
        engine already counts as bound is not queued again, and an older sight of a bound pod only counts it until its
        deletion arrives, so the lag can no longer cost more than a wait. The watch's pod events applied while the
        lists were on their way may be newer than them: a pod it saw deleted is not brought back by the list (its
        devices would be held by nobody, for good), one it saw alive is not forgotten for missing from it.
        """
        if self._caught_up is None:
            self._caught_up = threading.Event()
            self._since_listing = {"pods": (set(), set()), CLAIMS_KIND: (set(), set())}
            log.info("listing every pod before deciding: the watches may lag behind the previous leader")
            threading.Thread(target=self._list_afresh, args=(self._caught_up,), name="catch-up", daemon=True).start()
        return self._caught_up.is_set()

    def _list_afresh(self, done: threading.Event) -> None:
        """The catch-up thread: each list, asked again while the API server cannot answer it (`_asked`) and after an
        unexpected error too, since the leader decides nothing until it has them."""
        paths = [("pods", "/api/v1/pods")]
        if self.watch_dra and self.dra_problem is None:  # claims first: the pods' accounting reads them
            paths.insert(0, (CLAIMS_KIND, f"/apis/{DRA_GROUP}/v1/{CLAIMS_KIND}"))
        lists: list[tuple[str, list[dict[str, Any]]]] = []
        backoff = 0.5
        while len(lists) < len(paths) and not self.stop.is_set():
            what, path = paths[len(lists)]
            try:
                listed = self._asked(path, partial(self._items, path))
            except Exception:
                log.exception("listing %s failed; retrying in %.1fs", what, backoff)
                self.stop.wait(backoff)
                backoff = min(30.0, backoff * 2)
                continue
            if listed is None:
                if self.stop.is_set():
                    return
                # A 404: an API server behind the same address that does not serve it (mid-upgrade). Ended here,
                # the leader never decided again.
                log.warning("listing %s: not found (404); retrying in %.1fs", what, backoff)
                self.stop.wait(backoff)
                backoff = min(30.0, backoff * 2)
                continue
            lists.append((what, listed))
        if len(lists) == len(paths):
            self.post(self._apply_fresh, lists, done)

    def _items(self, path: str) -> list[dict[str, Any]]:
        return self.client.list(path)[0]

    def _apply_fresh(self, lists: list[tuple[str, list[dict[str, Any]]]], done: threading.Event) -> None:
        seen, self._since_listing = self._since_listing or {}, None
        for what, items in lists:
            alive, gone = seen.get(what, (set(), set()))
            fresh = [obj for obj in items if _uid(obj) not in gone]  # deleted since: the list is older
            if what == CLAIMS_KIND:
                self.on_dra(CLAIMS_KIND, "SYNC", fresh, keep=alive)
            else:
                self.on_pods("SYNC", fresh, keep=alive)
                for obj in fresh:
                    meta = obj.get("metadata") if isinstance(obj, dict) else None
                    if isinstance(meta, dict) and (uid := _uid(obj)):
                        self._listed[f"{meta.get('namespace', 'default')}/{meta.get('name')}"] = uid
        done.set()
        log.info("caught up: %s listed afresh", ", ".join(f"{len(items)} {what}" for what, items in lists))

    def healthy(self) -> bool:
        return time.monotonic() - self.heartbeat < STALL

    def apis(self) -> dict[str, str | None]:
        """The group/version each discovered collection is read in (what `/readyz` shows); None: the API server
        serves none that kubegpu reads, so that collection is taken as empty."""
        return dict(self.versions)

    def server(self) -> tuple[str | None, list[str], str | None]:
        """The API server's version, the warnings about it, and why it is refused (None: it is not)."""
        return self.kubernetes, list(self.server_warnings), self.refusal

    # -- the API server itself (`kubegpu.kube.discovery`) -------------------------------------------------------

    def survey_server(self) -> None:
        """The discovery thread: the server's version (one older than kubegpu supports is refused: the front-end
        stops and exits 2; a newer one is served with a warning), then the API Events are written in, and the
        Leases' where this front-end takes any. Each question is retried while the server cannot answer it."""
        try:
            self._survey()
        finally:
            if self.surveyed is not None and self.refusal is None:
                self.surveyed.set()

    def _survey(self) -> None:
        document = self._asked("/version", lambda: self.client.get("/version"))
        version = discovery.server_version(document)
        if version is None:
            if not self.stop.is_set():
                log.warning("the API server's /version states no version kubegpu can read; going on")
        else:
            self.kubernetes = str(version)
            self.server_version = (version.major, version.minor)
            verdict = discovery.version_verdict(version)
            if verdict is not None and verdict[0]:
                log.error("%s", verdict[1])
                self.refusal = verdict[1]
                self.stop.set()
                return
            if verdict is not None:
                log.warning("%s", verdict[1])
                self.server_warnings.append(verdict[1])
            log.info("API server is Kubernetes %s", version)
        events = self._asked("/apis/events.k8s.io", lambda: discovery.events_api(self.client))
        if events is not None:
            self.binder.events_api = self.versions["events"] = events
            log.info("Events written as %s", events if "/" in events else f"core/{events}")
        if self.needs_leases:
            leases = self._asked(
                "/apis/coordination.k8s.io", lambda: discovery.discover(self.client, LEASE_GROUP, ("v1",))
            )
            if not self.stop.is_set():
                self.versions["leases"] = None if leases is None else f"{LEASE_GROUP}/{leases}"
                if leases is None:
                    log.error(
                        "the API server serves no %s/v1: leader election and node liveness cannot work", LEASE_GROUP
                    )

    def _asked(self, what: str, ask: Callable[[], T]) -> T | None:
        """`ask()`, asked again with a backoff that doubles to 30 s while the API server cannot answer; None when
        stopped, or when `what` is not served at all (a 404 the asker did not turn into an answer)."""
        backoff = 0.5
        while not self.stop.is_set():
            try:
                return ask()
            except ApiError as exc:
                if exc.status == 404:
                    return None
                log.warning("discovery of %s: %s; retrying in %.1fs", what, exc, backoff)
            self.stop.wait(backoff)
            backoff = min(30.0, backoff * 2)
        return None

    # -- node liveness (`kubegpu.scheduler.liveness`): the advertisers' Leases, judged on a one-second tick --------

    def judge_nodes(self) -> None:
        """Tell the engine which nodes may take new device pods. Leases expire with time, not with an event, so
        this runs on a tick (`liveness.TICK`); a node that comes back wakes the pending pods."""
        if self.leases is None or not self.leases.synced:
            return
        now = time.monotonic()
        if now < self._next_judgement:
            return
        self._next_judgement = now + liveness.TICK
        revived = False
        for name, reason in self.leases.verdicts(self.engine.node_names()).items():
            if self.engine.set_node_live(name, reason is None, reason):
                revived |= reason is None
        if revived:
            self.pending.wake()

    def recheck_digests(self) -> None:
        """Every `DIGEST_RECHECK` seconds, build again the nodes whose plugins' digests changed with time alone
        (`Engine.recheck_digests`: HAMi's handshake gone stale with no Node update), and wake the pending pods when
        one did. Called with the lock held, from the front-end's loop."""
        now = time.monotonic()
        if now < self._next_digest_check:
            return
        self._next_digest_check = now + DIGEST_RECHECK
        changed = self.engine.recheck_digests()
        if changed:
            log.info("%d node(s) built again: what a plugin reads of them changed with time (first: %s)",
                     len(changed), safe_text(changed[0], 253))  # fmt: skip
            self.pending.wake()

    # -- PodDisruptionBudgets ---------------------------------------------------------------------------------------

    def watch_budget_versions(self) -> None:
        """The budgets' informer thread: find the version the API server serves (retrying while it cannot be asked),
        then list and watch it. A server that serves none (a future one, or one with policy turned off) has no
        budgets: an error says so once, `/readyz` names it, and preemption goes on without them. While this process
        may not list them (a role from before it read budgets: the extender's), the same, a warning naming the role,
        and the list is tried again every `PODGROUP_RECHECK` seconds."""
        version = self.discover_version("policy", BUDGET_VERSIONS)
        if self.stop.is_set():
            return
        self.versions[BUDGETS] = None if version is None else f"policy/{version}"
        if version is None:
            log.error(
                "the API server serves PodDisruptionBudgets in none of %s; preemption ignores budgets",
                ", ".join(f"policy/{v}" for v in BUDGET_VERSIONS),
            )
            self.post(self.on_budgets, "SYNC", [])
            return
        path = f"/apis/policy/{version}/{BUDGETS}"
        said = False
        while (problem := self._forbidden(path)) is not None:
            self.versions[BUDGETS] = None
            if not said:
                said = True
                log.warning(
                    "this process may not list PodDisruptionBudgets (%s); preemption counts no budget until its role "
                    "allows it (the shipped roles in examples/deploy do)",
                    problem,
                )
                self.post(self.on_budgets, "SYNC", [])
            if self.stop.wait(PODGROUP_RECHECK):
                return
        self.versions[BUDGETS] = f"policy/{version}"
        log.info("PodDisruptionBudgets read as policy/%s", version)
        Informer(self.client, path, self._consume(self.on_budgets), self.stop, BUDGETS).run()

    def watch_podgroup_versions(self) -> None:
        """The PodGroups' informer thread: the version the API server serves, then list and watch it. While it serves
        none (no CRD), or this scheduler may not list them (its role predates gangs), the collection counts as listed
        and empty, a warning says why once, `/readyz` names it, and both are asked again every `PODGROUP_RECHECK`
        seconds."""
        said: str | None = None
        while not self.stop.is_set():
            version = self.discover_version(PODGROUP_GROUP, PODGROUP_VERSIONS)
            if self.stop.is_set():
                return
            path = f"/apis/{PODGROUP_GROUP}/{version}/{PODGROUPS}"
            problem = "absent" if version is None else self._forbidden(path)
            if problem is None:
                break
            self.versions[PODGROUPS] = None
            if said != problem:
                said = problem
                log.warning(
                    "%s; gangs are read from Kueue's pod-group labels only until %s",
                    "the API server serves no PodGroups (scheduling.x-k8s.io/v1alpha1)"
                    if problem == "absent"
                    else f"this scheduler may not list PodGroups ({problem})",
                    "the CRD is installed (examples/deploy/kustomize/base/podgroup-crd.yaml)"
                    if problem == "absent"
                    else "its role allows it (examples/deploy/scheduler/rbac.yaml)",
                )
                self.post(self.on_podgroups, "SYNC", [])
            self.stop.wait(PODGROUP_RECHECK)
        else:  # stopped before the PodGroups could be read
            return
        self.versions[PODGROUPS] = f"{PODGROUP_GROUP}/{version}"
        log.info("PodGroups read as %s/%s", PODGROUP_GROUP, version)
        Informer(self.client, path, self._consume(self.on_podgroups), self.stop, PODGROUPS).run()

    def _forbidden(self, path: str) -> str | None:
        """Why this process may not list the collection at `path` (a 401 or 403), or None; other failures are the
        informer's to retry."""
        try:
            self.client.get(path, limit=1)
        except ApiError as exc:
            if exc.status in (401, 403):
                return f"{exc.status} {safe_text(exc.reason)}"
        return None

    def on_podgroups(self, kind: str, payload: Any) -> None:
        """A PodGroup informer's report: each group's spec (or why it cannot be read) into `podgroups`, and its
        waiting members woken. One that raises costs only itself."""
        if kind == "SYNC":
            seen = set()
            for obj in payload:
                seen.add(self._guarded("podgroup_event", obj, self._apply_podgroup, "ADDED", on_pod=False))
            for key in [k for k in self.podgroups if k not in seen]:
                self._forget_podgroup(key)
            self.podgroups_synced.set()
            return
        self._guarded("podgroup_event", payload, self._apply_podgroup, kind, on_pod=False)

    def _apply_podgroup(self, kind: str, obj: dict[str, Any]) -> str | None:
        """One PodGroup into `podgroups`: its spec, or the reason it cannot be read (which its members are told).
        Returns its key."""
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str) or not name:
            return None
        key = f"{namespace}/{name}"
        if kind == "DELETED":
            self._forget_podgroup(key)
            return key
        uid = str(meta.get("uid", ""))
        if self.podgroup_uids.get(key) != uid and self.gang_members is not None:
            self.gang_members.touch(key)  # a PodGroup made (again): its status is due on it
        self.podgroup_uids[key] = uid
        try:
            group: PodGroup | str = podgroups.pod_group(obj)
        except InputError as exc:
            group = safe_text(f"PodGroup {key} cannot be read: {exc}")
            if self.podgroups.get(key) != group:
                log.warning("%s", group)
        if self.podgroups.get(key) == group:
            return key
        self.podgroups[key] = group
        # The engine knows only the groups it can place; a member of one it cannot read is refused by the front-end.
        self.engine.set_pod_group(group if isinstance(group, PodGroup) else None, key)
        self.pending.wake_group(key)
        return key

    def _forget_podgroup(self, key: str) -> None:
        self.podgroups.pop(key, None)
        self.podgroup_uids.pop(key, None)
        self.engine.set_pod_group(None, key)
        self.pending.wake_group(key)

    def podgroup(self, key: str) -> tuple[str, int] | None:
        """The uid and minMember of the PodGroup `key` (`namespace/name`); None when it does not exist or cannot be
        read (`gangstatus.GroupStatus` writes only on these)."""
        group = self.podgroups.get(key)
        if not isinstance(group, PodGroup):
            return None
        return self.podgroup_uids.get(key, ""), group.min_member

    def podgroup_uid(self, key: str) -> str | None:
        """The uid of the PodGroup `key` while it exists, whether kubegpu can read its spec or not; else None."""
        return self.podgroup_uids.get(key) if key in self.podgroups else None

    def discover_version(self, group: str, wanted: tuple[str, ...]) -> str | None:
        """The first of `wanted` the API server serves for `group`, asked again while the discovery document cannot
        be read (`_asked`); None when it serves none of them, or once stopped."""
        return self._asked(f"/apis/{group}", lambda: discovery.discover(self.client, group, wanted))

    def on_budgets(self, kind: str, payload: Any) -> None:
        if kind == "SYNC":
            self.budgets.clear()
            for obj in payload:
                self._apply_budget("ADDED", obj)
            self.budgets_synced.set()
            return
        self._apply_budget(kind, payload)

    def _apply_budget(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
        if kind == "DELETED":
            self.budgets.pop(key, None)
            return
        try:
            self.budgets[key] = objects.budget(obj)
        except InputError as exc:
            log.warning("PodDisruptionBudget %s ignored: %s", key, exc)

    # -- DRA: DeviceClasses, ResourceSlices, ResourceClaimTemplates, ResourceClaims (`watch_dra`) ------------------

    def watch_dra_versions(self) -> None:
        """The DRA collections' thread: wait until the API server serves all four in `resource.k8s.io/v1` and this
        scheduler may list them, then list and watch each. Meanwhile they count as listed and empty, a warning says
        why once, `/readyz` names them, and pods with claims are told `dra_problem`."""
        said: str | None = None
        while not self.stop.is_set():
            problem = self._dra_unreadable()
            if self.stop.is_set():
                return
            if problem is None:
                break
            for kind in DRA_KINDS:
                self.versions[kind] = None
            self.dra_problem = problem
            if said != problem:
                said = problem
                log.warning("%s; pods with resource claims wait until it can", problem)
                for kind in DRA_KINDS:
                    self.post(self.on_dra, kind, "SYNC", [])
            self.stop.wait(DRA_RECHECK)
        else:
            return
        log.info("DRA read as %s/v1", DRA_GROUP)
        for kind in DRA_KINDS:
            self.versions[kind] = f"{DRA_GROUP}/v1"
            consume = self._consume(partial(self.on_dra, kind))
            Informer(self.client, f"/apis/{DRA_GROUP}/v1/{kind}", consume, self.stop, kind).start()
        self.dra_problem = None

    def on_namespaces(self, kind: str, payload: Any) -> None:
        """The namespaces informer's report into the engine: each namespace's labels."""
        if kind == "SYNC":
            named = dict(found for obj in payload if (found := self._namespace(obj)) is not None)
            changed = self.engine.set_namespaces(named)
            self.namespaces_synced.set()
        else:
            found = self._namespace(payload)
            if found is None:
                return
            changed = self.engine.set_namespace(found[0], None if kind == "DELETED" else found[1])
        if changed:
            self.pending.wake()

    @staticmethod
    def _namespace(obj: Any) -> tuple[str, dict[str, str]] | None:
        try:
            return objects.namespace(obj if isinstance(obj, dict) else {})
        except InputError as exc:
            log.warning("Namespace ignored: %s", safe_text(str(exc)))
            return None

    def _dra_unreadable(self) -> str | None:
        """Why the DRA collections cannot be read (not served, some missing, forbidden), or None."""
        version = self.discover_version(DRA_GROUP, DRA_VERSIONS)
        if version is None:
            return f"the API server does not serve {DRA_GROUP}/v1 (DRA, Kubernetes 1.34+)"
        try:
            listed = self.client.get(f"/apis/{DRA_GROUP}/v1")
            served = {r.get("name") for r in listed.get("resources") or () if isinstance(r, dict)}
            missing = [kind for kind in DRA_KINDS if kind not in served]
            if missing:
                return f"the API server serves {DRA_GROUP}/v1 without {', '.join(missing)}"
            for kind in DRA_KINDS:
                self.client.get(f"/apis/{DRA_GROUP}/v1/{kind}", limit=1)
        except ApiError as exc:
            if exc.status in (401, 403):
                return f"this scheduler may not list {DRA_GROUP}/v1 objects ({exc.status} {safe_text(exc.reason)})"
            return f"{DRA_GROUP}/v1 could not be read: {safe_text(str(exc))}"
        return None

    def on_dra(self, collection: str, kind: str, payload: Any, keep: Iterable[tuple[str, str]] = ()) -> None:
        """A DRA informer's report into the engine's book; one object that raises, or that kubegpu cannot read,
        costs only itself (left out with a warning: the pods naming it are refused as if it were absent). A list
        (`SYNC`) forgets the objects not in it, but those in `keep`."""
        apply = partial(self._apply_dra, collection)
        if kind == "SYNC":
            seen: set[tuple[str, str] | None] = set(keep)
            # The informer's relist of claims, maybe newer than a new leader's fresh list on its way (`caught_up`).
            noting = collection == CLAIMS_KIND and self._since_listing is not None
            for obj in payload:
                named = self._guarded("dra_event", obj, apply, "ADDED", on_pod=False)
                seen.add(named)
                if noting and named is not None:
                    self._seen_since_listing(collection, named, False, obj)
            for key in self.engine.dra_keys(collection):
                if key not in seen and not self._held_unwritten(collection, key):
                    claim = self.engine.resource_claim(*key) if noting else None
                    if claim is not None:  # gone for good: the older fresh list must not bring it back
                        self._seen_since_listing(collection, key, True, {"metadata": {"uid": claim.uid}})
                    self._apply_dra(collection, "DELETED", {"metadata": {"namespace": key[0], "name": key[1]}})
            self.dra_synced[collection].set()
        else:
            if collection == CLAIMS_KIND and self._since_listing is not None and isinstance(payload, dict):
                meta = payload.get("metadata") or {}
                named = (str(meta.get("namespace", "")), meta.get("name"))
                self._seen_since_listing(collection, named, kind == "DELETED", payload)
            self._guarded("dra_event", payload, apply, kind, on_pod=False)
        self.pending.wake()

    def _apply_dra(self, collection: str, kind: str, obj: dict[str, Any]) -> tuple[str, str] | None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return None
        namespace = str(meta.get("namespace", "")) if collection in ("resourceclaims", "resourceclaimtemplates") else ""
        found: Any = None
        if kind != "DELETED":
            try:
                found = DECODERS[collection](obj)
            except InputError as exc:
                where = f"{namespace}/{name}" if namespace else name
                log.warning("%s %s ignored: %s", collection, where, safe_text(str(exc)))
            if isinstance(found, dra.Claim | dra.Template) and found.problem is not None:
                log.warning(
                    "%s %s/%s read without its spec (its pods are told why; an allocation holds its devices): %s",
                    collection,
                    namespace,
                    name,
                    safe_text(found.problem),
                )
        engine = self.engine
        if collection == "deviceclasses":
            engine.set_device_class(name, found)
        elif collection == "resourceslices":
            engine.set_resource_slice(name, found)
        elif collection == "resourceclaimtemplates":
            spec = obj.get("spec") if found is not None else None
            if isinstance(spec, dict):
                self.claim_templates[(namespace, name)] = spec
            else:
                self.claim_templates.pop((namespace, name), None)
            engine.set_resource_claim_template(namespace, name, found)
        else:
            engine.set_resource_claim(namespace, name, None if found is None else self._with_own_reservations(found))
        return (namespace, name)

    def _held_unwritten(self, collection: str, key: tuple[str, str]) -> bool:
        """Whether a claim a relist did not name is one the engine made for a pod whose writes are on their way."""
        current = self.engine.resource_claim(*key) if collection == "resourceclaims" else None
        return current is not None and any(self._holds(key, c) for c in current.reserved_for)

    def _with_own_reservations(self, found: dra.Claim) -> dra.Claim:
        """The claim as the server reports it, with the allocation and reservations of the pods the engine holds it
        for and whose writes may not have landed yet (an older copy must not free their devices meanwhile). A
        different allocation on the server wins: the pods' writes then fail and they are tried again."""
        current = self.engine.resource_claim(found.namespace, found.name)
        if current is None or current.allocation is None:
            return found
        ours = [c for c in current.reserved_for if self._holds(found.key, c)]
        if not ours:
            return found
        if found.allocation is None:
            found = replace(found, allocation=current.allocation, node_terms=current.node_terms)
        elif _results(found.allocation) != _results(current.allocation):
            return found
        uids = {c.get("uid") for c in found.reserved_for}
        return replace(found, reserved_for=(*found.reserved_for, *(c for c in ours if c.get("uid") not in uids)))

    def _holds(self, key: tuple[str, str], consumer: Mapping[str, str]) -> bool:
        """Whether the engine holds claim `key` for the pod `consumer` names (same name and UID)."""
        held = self.engine.held_claims(f"{key[0]}/{consumer.get('name')}")
        return any(
            h.claim.key == key and any(c.get("uid") == consumer.get("uid") for c in h.claim.reserved_for) for h in held
        )

    # -- PersistentVolumeClaims and PersistentVolumes (`watch_volumes`) ---------------------------------------------

    def on_claims(self, kind: str, payload: Any) -> None:
        if kind == "SYNC":
            changed, seen = False, set()
            for obj in payload:
                changed |= self._guarded("claim_event", obj, self._apply_claim, "ADDED", on_pod=False) is True
                meta = obj.get("metadata") or {}
                seen.add((str(meta.get("namespace", "default")), str(meta.get("name"))))
            for namespace, name in self.engine.claim_keys():
                if (namespace, name) not in seen:
                    changed |= self.engine.set_claim(namespace, name, None)
            self.claims_synced.set()
        else:
            changed = self._guarded("claim_event", payload, self._apply_claim, kind, on_pod=False) is True
        if changed:
            self.pending.wake()

    def _apply_claim(self, kind: str, obj: dict[str, Any]) -> bool:
        """A claim's bound volume ("" until it is Bound) into the engine; a claim kubegpu cannot read is left out, as
        if absent, so only the pods naming it are refused. True when the engine's record changed."""
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "default")), meta.get("name")
        if not isinstance(name, str) or not name:
            return False
        volume: str | None = None
        deleting = False
        if kind != "DELETED":
            try:
                _, _, volume, deleting = objects.claim(obj)
            except InputError as exc:
                log.warning("PersistentVolumeClaim %s/%s ignored: %s", namespace, name, exc)
        return self.engine.set_claim(namespace, name, volume, deleting)

    def on_volumes(self, kind: str, payload: Any) -> None:
        if kind == "SYNC":
            changed, seen = False, set()
            for obj in payload:
                changed |= self._guarded("volume_event", obj, self._apply_volume, "ADDED", on_pod=False) is True
                seen.add(str((obj.get("metadata") or {}).get("name")))
            for name in self.engine.volume_names():
                if name not in seen:
                    changed |= self.engine.set_volume(name, None, deleted=True)
            self.volumes_synced.set()
        else:
            changed = self._guarded("volume_event", payload, self._apply_volume, kind, on_pod=False) is True
        if changed:
            self.pending.wake()

    def _apply_volume(self, kind: str, obj: dict[str, Any]) -> bool:
        """A volume's required node affinity into the engine; a volume kubegpu cannot read is left out, as if absent,
        so only the pods whose claims it binds are refused. True when the engine's record changed."""
        name = (obj.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            return False
        if kind != "DELETED":
            try:
                return self.engine.set_volume(name, objects.volume(obj)[1])
            except InputError as exc:
                log.warning("PersistentVolume %s ignored: %s", name, exc)
        return self.engine.set_volume(name, None, deleted=True)

    # -- Services, ReplicationControllers, ReplicaSets and StatefulSets (`watch_owners`) -------------------------------

    def on_owners(self, owner: str, kind: str, payload: Any) -> None:
        """An informer's report for one owner kind (`OWNER_PATHS`). A change can only matter to a pod whose default
        constraints include a DoNotSchedule one (a configured list): the pending pods are woken then."""
        apply = partial(self._apply_owner, owner)
        if kind == "SYNC":
            changed, seen = False, set()
            for obj in payload:
                changed |= self._guarded("owner_event", obj, apply, "ADDED", on_pod=False) is True
                meta = obj.get("metadata") or {}
                seen.add((str(meta.get("namespace", "default")), str(meta.get("name"))))
            for known, namespace, name in self.engine.owner_keys():
                if known == owner and (namespace, name) not in seen:
                    changed |= self.engine.set_owner(owner, namespace, name, None)
            self.owners_synced[owner].set()
        else:
            changed = self._guarded("owner_event", payload, apply, kind, on_pod=False) is True
        if changed:
            self.pending.wake()

    def _apply_owner(self, owner: str, kind: str, obj: dict[str, Any]) -> bool:
        """An owner's selector into the engine; one kubegpu cannot read selects nothing (as client-go's listers skip
        a selector they cannot parse). True when the engine's record changed."""
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "default")), meta.get("name")
        if not isinstance(name, str) or not name:
            return False
        selector = None
        if kind != "DELETED":
            try:
                selector = objects.owner(owner, obj)[3]
            except InputError as exc:
                log.warning("%s %s/%s selects no pod here: %s", owner, namespace, name, exc)
        return self.engine.set_owner(owner, namespace, name, selector)

    # -- node events ------------------------------------------------------------------------------------------------

    def on_nodes(self, kind: str, payload: Any) -> None:
        changed = False
        if kind == "SYNC":
            seen = set()
            for obj in payload:
                changed |= self._guarded("node_event", obj, self._apply_node, "ADDED") is True
                seen.add((obj.get("metadata") or {}).get("name"))
            for name in list(self.engine.node_names()):
                if name not in seen:
                    self._node_gone(name)
            self.nodes_synced.set()
        else:
            changed = self._guarded("node_event", payload, self._apply_node, kind) is True
        if changed:
            self.pending.wake()

    def _node_info(self, obj: dict[str, Any]) -> NodeInfo | None:
        try:
            return node_info(obj)
        except InputError as exc:
            name = (obj.get("metadata") or {}).get("name")
            log.error("node ignored the advertised inventory: %s", exc, extra={"node": name})
            annotations = dict((obj.get("metadata") or {}).get("annotations") or {})
            annotations.pop("kubegpu.io/devices", None)
            try:
                return node_info({**obj, "metadata": {**obj["metadata"], "annotations": annotations}})
            except (InputError, KeyError):
                return None

    def _apply_node(self, kind: str, obj: dict[str, Any]) -> bool:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return False
        if kind == "DELETED":
            self._node_gone(name)
            return False
        info = self._node_info(obj)
        if info is None:
            return False
        previous = self.engine.node_info(name)
        if previous != info:
            self.engine.add_node(info)  # images and annotations too: scores read them
        if previous is None and self._orphans:
            self._count_orphans(name)
        moved = self._apply_foreign_devices(name, obj)
        return self.engine.node_change_may_help(previous, info) is not None or bool(moved)

    def _node_gone(self, name: str) -> None:
        """A Node deleted (or absent from a relist): the engine lets go of it; its pods are kept as orphans, but those
        waiting at Permit: bound nowhere, they held a place in this process alone, and are placed again (kept, one
        would be counted on the node as well, had it come back, after it was bound elsewhere)."""
        placed = self.engine.placements(self.engine.holders(name))
        held = [p for p in placed if not self.engine.is_waiting(p.request.key)]
        self.engine.remove_node(name)
        for placement in held:
            self._keep_orphan(placement)
            log.info("node deleted; its pod is counted again if the node comes back",
                     extra={"pod": placement.request.key, "node": name})  # fmt: skip

    def _count_orphans(self, name: str) -> None:
        """A Node of `name` is back: the pods still bound to it hold what they held before it went."""
        for key, placement in [(k, p) for k, p in self._orphans.items() if p.node == name]:
            uncounted = key in self._uncounted
            self._drop_orphan(key)
            if uncounted:  # met before its Node: counted as any bound pod is, its allocation checked now
                self._assume(placement.request)
                continue
            request, allocation = placement.request, placement.allocation
            extra = {"pod": key, "node": name}
            if allocation is None and any(self.engine.plugins.owner_of(r) for r in request.requested_resources()):
                self._admit_by_count(request, name)  # logs what it could not count
                continue
            status = self.engine.admit_bound(request, name, allocation)
            if not status.ok:
                # The Node came back otherwise (a card lost while it was away): the pod runs there all the same, so
                # it is counted as any bound pod whose allocation holds no devices, by what it asks (`_assume`).
                log.warning("pod of a node made again no longer fits its allocation: %s", status.message, extra=extra)
                self._assume(request, name)

    def _keep_orphan(self, placement: Placement, *, counted: bool = True) -> None:
        """Keep a bound pod whose Node is not listed (`_orphans`): `counted`, one the engine held before its Node
        went; else one met before its Node (`_uncounted`), whose allocation is checked when the Node comes."""
        key = placement.request.key
        self._orphans[key] = placement
        if not counted:
            self._uncounted.add(key)
        allocation = placement.allocation
        if allocation is not None and self.engine.needs_verify_key(placement.request, placement.node, allocation):
            self._orphans_on_verify_keys.add(key)
        else:
            self._orphans_on_verify_keys.discard(key)

    def _drop_orphan(self, key: str) -> None:
        self._orphans.pop(key, None)
        self._uncounted.discard(key)
        self._orphans_on_verify_keys.discard(key)

    def pods_on_verify_keys(self) -> int:
        """How many bound pods hold devices by an allocation only a verify key verifies (`kubegpu_scheduler_pods_on_
        verify_keys`): the engine's (`Engine.pods_on_verify_keys`) and those whose Node is not listed (`_orphans`),
        which run on all the same. Read from the metrics thread: two set sizes, no iteration."""
        return self.engine.pods_on_verify_keys() + len(self._orphans_on_verify_keys)

    def _admit_by_count(self, request: PodRequest, node: str) -> bool:
        """Count a device pod bound to `node` without a verified allocation as its kubelet does (`admit_by_count`).
        Where its plugins set no devices aside for it (a request no plugin would place, such as a share of 200 %
        compute, or no room left by their books), it is counted without devices: the kubelet admitted it by count,
        so its cpu, memory and resource counts are in use all the same, and left out the node took a pod of another
        tenant that its kubelet then refused. Returns whether it is counted (logged where not)."""
        extra = {"pod": request.key, "node": node}
        decision = self.engine.admit_by_count(request, node)
        if decision.scheduled:
            return True
        status = self.engine.admit_bound(request, node, None)
        if status.ok:
            log.warning("bound pod without an allocation is counted without devices: %s", decision.reason, extra=extra)
            return True
        log.error("bound pod without an allocation could not be counted: %s", status.message, extra=extra)
        return False

    def _apply_foreign_devices(self, name: str, obj: dict[str, Any]) -> list[str]:
        """The device ids the node's kubelet gave pods kubegpu did not place, as its node side publishes them
        (`kubegpu.io/foreign-devices`, `kubegpu.crishim.podresources`): those pods hold exactly these ids. Returns the
        pods moved from a count to exact ids (the devices free on the node may differ now)."""
        raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(FOREIGN_DEVICES_KEY)
        held: dict[str, dict[str, dict[str, list[str]]]] = {}
        if raw is not None:
            try:
                held = decode_foreign_devices(raw).pods
            except AnnotationError as exc:
                log.warning("node's foreign devices ignored: %s", exc, extra={"node": name})
        moved = self.engine.set_held_devices(name, held)
        for key in moved:
            log.info("pod holds the devices its kubelet reports", extra={"pod": key, "node": name})
        return moved

    # -- pod events -------------------------------------------------------------------------------------------------

    def on_pods(self, kind: str, payload: Any, keep: Iterable[str] = ()) -> None:
        """One pod event, or a list (`SYNC`: the pods not in it are gone, but those in `keep`)."""
        if kind == "SYNC":
            self._listed.clear()  # the informer's own list: its watch goes on from there
            live = set(keep)
            noting = self._since_listing is not None  # the informer's relist, maybe newer than a fresh list on its way
            for obj in payload:
                self._guarded("pod_event", obj, self._apply_pod, "ADDED")
                meta = obj.get("metadata") or {}
                key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
                live.add(key)
                if noting and isinstance(obj, dict):
                    status = obj.get("status")
                    self._seen_since_listing(
                        "pods", key, isinstance(status, dict) and status.get("phase") in FINISHED, obj
                    )
            for key in [k for k in self.engine.pod_keys() if k not in live and self.pending.binding(k) is None]:
                placed = self.engine.placement(key) if noting else None
                if placed is not None:  # gone for good, with the claims made for it: the older fresh lists must not
                    self._seen_since_listing("pods", key, True, {"metadata": {"uid": placed.request.uid}})
                    for held in self.engine.held_claims(key):  # bring them back
                        if held.owned:
                            named = (held.claim.namespace, held.claim.name)
                            self._seen_since_listing(CLAIMS_KIND, named, True, {"metadata": {"uid": held.claim.uid}})
                if self.bound_leaving is not None and (gone := self.engine.placement(key)) is not None:
                    self.bound_leaving(gone.request, gone.node, True, False)  # gone unseen: no sign of why
                self.release(key)
            self.pending.keep_only(live)
            self.engine.unnominate_all_but(live)
            if self.gang_members is not None:
                self.gang_members.keep_only(live)
            for key in [k for k in self.gated if k not in live]:
                self._ungate(key)
            for key in [k for k in self._refused if k not in live]:
                del self._refused[key]
            for key in [k for k in self._partly if k not in live]:
                del self._partly[key]
            for key in [k for k in self._orphans if k not in live]:
                self._drop_orphan(key)
            # The pending pods the list no longer shows take their sizes along (`release` took the placed ones').
            for key in [k for k in self._sizes if k not in live and self.engine.placement(k) is None]:
                del self._sizes[key]
            self.pods_synced.set()
            return
        if self._listed and isinstance(payload, dict):
            meta = payload.get("metadata") or {}
            key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
            listed = self._listed.get(key)
            if listed is not None:
                if listed != _uid(payload):  # an older pod of that name, from a watch behind the fresh list
                    log.info("an event of an older pod of this name left alone: the watch is behind the fresh list",
                             extra={"pod": key})  # fmt: skip
                    return
                del self._listed[key]  # the watch has caught up with the listed pod
        if self._since_listing is not None and isinstance(payload, dict):
            meta = payload.get("metadata") or {}
            status = payload.get("status")
            ended = kind == "DELETED" or (isinstance(status, dict) and status.get("phase") in FINISHED)
            self._seen_since_listing("pods", f"{meta.get('namespace', 'default')}/{meta.get('name')}", ended, payload)
        self._guarded("pod_event", payload, self._apply_pod, kind)

    def _seen_since_listing(self, what: str, key: object, ended: bool, obj: dict[str, Any]) -> None:
        """Note a watch event that came while a new leader's fresh lists are on their way (`caught_up`): `ended`,
        the object is deleted or, a pod, finished (for good: an older list's sight of its uid is not applied)."""
        seen = self._since_listing.get(what) if self._since_listing is not None else None
        if seen is None:
            return
        alive, gone = seen
        if ended:
            alive.discard(key)
            if uid := _uid(obj):
                gone.add(uid)
        else:
            alive.add(key)

    def _guarded(self, stage: str, obj: dict[str, Any], apply: Any, kind: str, *, on_pod: bool = True) -> Any:
        """Apply one informer object; an unexpected error costs that object an error log, a metric and, for a pod,
        an Event, never the loop (a tenant's object must not be able to stop scheduling for everyone)."""
        try:
            return apply(kind, obj)
        except Exception as exc:
            meta = obj.get("metadata") or {}
            self.internal_error(stage, meta, exc, on_pod=on_pod)
            return None

    def internal_error(self, stage: str, meta: dict[str, Any], exc: Exception, *, on_pod: bool = True) -> None:
        """Report an object whose handling raised: an error log, the metric and, for a pod, an Event on it (`on_pod`
        false: a claim or a volume, named in the log only)."""
        self.metrics.internal_errors.labels(stage).inc()
        name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
        if not on_pod:
            where = f"{namespace}/{name}" if namespace else name
            log.error("%s failed for %s; the object is skipped: %r", stage, where, exc, exc_info=exc)
            return
        what = {"pod": f"{namespace}/{name}"} if namespace else {"node": name}
        log.error("%s failed; the object is skipped: %r", stage, exc, exc_info=exc, extra=what)
        if namespace and name:
            pod = PodRequest(namespace=namespace, name=name, uid=str(meta.get("uid", "")), containers=())
            self.binder.event(pod, "KubegpuInternalError", f"kubegpu could not handle this pod ({stage}): {exc!r}")

    @property
    def evicting(self) -> AbstractSet[str]:
        """The victims a preemption deleted whose pods are not gone yet (read-only: `evicting_started` adds)."""
        return self._evicting

    def evicting_started(self, victims: Iterable[str]) -> None:
        """A preemption deleted these pods; they count as leaving until their pods are gone (`release`)."""
        self._evicting.update(victims)

    def evicting_failed(self, victims: Iterable[str]) -> None:
        """These victims' deletions failed: they stay, so they no longer count as leaving, and the pods waiting for
        them are tried again (a preemptor preempts anew)."""
        self._evicting.difference_update(victims)
        self.pending.wake()

    def release(self, key: str) -> None:
        """The pod's resources are free again (it is gone, or its Binding failed); the pending pods may fit now."""
        self._evicting.discard(key)
        self._sizes.pop(key, None)
        placed = self.engine.placement(key)
        claims = self.engine.held_claims(key)
        if self.engine.release(key) is not None:
            if placed is not None:
                self._claims_given_back(placed.request, claims)
            self.pending.wake()

    def _claims_given_back(self, pod: PodRequest, claims: list[HeldClaim]) -> None:
        """The pod's DRA claims were given back in the engine: the front-end writes it (reservedFor, deallocation)."""
        if claims and self.claims_released is not None:
            self.claims_released(pod, claims)

    def roll_back(self, pod: PodRequest, node: str | None, error: ApiError) -> None:
        """Undo the reservation of a pod whose Binding failed, if the engine still holds it (and not a newer pod of
        the same name). Takes the lock: the extender calls this from its HTTP loop."""
        with self.lock:
            claims = self.engine.held_claims(pod.key)
            if self.engine.unreserve(pod, node):  # only this very pod's reservation, never a newer one's
                self._evicting.discard(pod.key)
                self._claims_given_back(pod, claims)
                self.pending.wake()
        log.warning("binding failed; reservation rolled back", extra={"pod": pod.key, "node": node, "error": error})

    def drop_pending(self, key: str) -> None:
        self.engine.unnominate(key)
        self.pending.drop(key)
        self._ungate(key)

    def _gate(self, key: str, reason: str, gates: tuple[str, ...]) -> None:
        """A PreEnqueue rule refused the pod (`Engine.pre_enqueue`): it waits outside the queue, tried by no cycle;
        `gates` (its scheduling gates) are counted per name."""
        self.drop_pending(key)
        self.gated[key] = reason
        self._gate_labels[key] = labels = tuple(dict.fromkeys(self._gate_label(gate) for gate in gates))
        self._count_gates(labels, +1)
        self.metrics.pending.labels("gated").set(len(self.gated))

    def _ungate(self, key: str) -> None:
        if self.gated.pop(key, None) is not None:
            self._count_gates(self._gate_labels.pop(key, ()), -1)
            self.metrics.pending.labels("gated").set(len(self.gated))

    def _count_gates(self, labels: tuple[str, ...], sign: int) -> None:
        """Keep `kubegpu_scheduler_gated_pods{gate}`: a series per gate name while any pod waits on it; the first
        `GATE_LABELS` names get their own (shortened and escaped), the others share `(other)`."""
        for label in labels:
            count = self._per_gate.get(label, 0) + sign
            if count > 0:
                self._per_gate[label] = count
                self.metrics.gated.labels(label).set(count)
            elif self._per_gate.pop(label, None) is not None:
                self.metrics.gated.remove(label)

    def _gate_label(self, gate: str) -> str:
        label = safe_text(shorten(gate))
        if label in self._per_gate or len(self._per_gate) < GATE_LABELS:
            return label
        return OTHER_GATES

    def _apply_pod(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
        members = self.gang_members
        if members is not None and ((gang := gang_of(obj)) is not None or key in members):
            members.observe(key, gang, None if kind == "DELETED" else member_state(obj))
        if kind == "MODIFIED" and not meta.get("deletionTimestamp"):
            # Most events are our own writes (the Binding) to pods we already account for: settle them from the raw
            # object without parsing the whole pod again.
            uid = self.pending.binding(key)
            if uid is not None and uid == meta.get("uid"):
                return
            held = self.engine.placement(key)
            phase = (obj.get("status") or {}).get("phase")
            if (
                held is not None
                and held.request.uid == meta.get("uid")
                and phase not in FINISHED
                and self._sizes.get(key) == sizes_of(obj)  # not resized in place
                and held.request.labels == (meta.get("labels") or {})  # nor relabelled
                # a pod waiting at Permit holds no Binding yet: an edit it cannot be read after reaches
                # `_unreadable_pod`, which gives its place back
                and (not self.engine.is_waiting(key) or held.request.annotations == (meta.get("annotations") or {}))
            ):
                return
        try:
            request, deleting = pod_request(obj, self.engine.plugins.qualifiers)
        except InputError as exc:
            partly = self._bound_partly(key, obj, str(exc))
            if partly is None:
                self._unreadable_pod(kind, key, obj, str(exc))
                return
            request, deleting = partly
        held = self.engine.placement(key)
        if held is not None and held.request.uid != request.uid:
            if self.bound_leaving is not None:  # gone unseen (a relist): no sign of why
                self.bound_leaving(held.request, held.node, True, False)
            self.release(key)  # a new pod took an old pod's name
            held = None
        binding_uid = self.pending.binding(key)
        binding = binding_uid is not None
        orphan = self._orphans.get(key)
        if orphan is not None and (orphan.request.uid != request.uid or kind == "DELETED" or request.phase in FINISHED):
            self._drop_orphan(key)
            orphan = None
        finished = request.phase in FINISHED or (held is not None and held.request.phase in FINISHED)
        if self.bound_leaving is not None and held is not None and (deleting or kind == "DELETED" or finished):
            # Kubernetes 1.26+ says why it deletes a pod (`gangcuts.preemption_mark`); a pod that finished unmarked
            # was no preemption's victim (1.27+ kubelets report a preempted pod Failed before it is gone, marked).
            mark = preemption_mark(obj.get("status"))
            gone = kind == "DELETED" or finished
            self.bound_leaving(held.request, held.node, gone, False if finished and mark is None else mark)
        if kind == "DELETED" or request.phase in FINISHED:
            self._refused.pop(key, None)
            self._partly.pop(key, None)
            self.drop_pending(key)
            # The pod whose Binding is being written is gone too: its answer may come after (the watch is another
            # connection), and a failed one rolls back nothing then.
            if not binding or binding_uid == request.uid:
                self.release(key)
            return
        if request.node_name:
            self.drop_pending(key)
            self._sizes[key] = sizes_of(obj)
            if self.engine.node_info(request.node_name) is None:
                if orphan is not None and key not in self._uncounted:
                    self._keep_orphan(replace(orphan, request=request))  # counted as it is now when its node is back
                    return
                if held is None and not binding:  # its Node not listed yet: counted when it is
                    self._keep_orphan(Placement(request, request.node_name, _claimed(request)), counted=False)
                    return
            if held is None and not binding:
                self._assume(request)
            if deleting:
                # Terminating: what it holds stays held until it is gone, but a preemptor nominated on its node may
                # count on it (`Engine.mark_leaving`), so the pods that fit beside the preemptor are let on.
                self.engine.mark_leaving(key)
            if held is None:
                return
            if (held.request.requests, held.request.containers, held.request.labels) != (
                request.requests,
                request.containers,
                request.labels,
            ):
                # Resized in place or relabelled: kube-scheduler counts the new requests and labels at once (the
                # cache's UpdatePod; inter-pod affinity and spread read the labels).
                self.engine.update_bound(request)
                self.pending.wake()
            return
        if not deleting and self.pending.answers_for(request.scheduler_name):
            refusal = self.engine.pre_enqueue(request)  # PreEnqueue: SchedulingGates
            if refusal is not None:
                if refusal.code is Code.ERROR:  # a rule failed (`rules.EmbedderPreEnqueue`): the pod is told why
                    self.metrics.internal_errors.labels("pre_enqueue").inc()
                    message = f"kubegpu could not handle this pod (pre_enqueue): {refusal.message}"
                    self.binder.event(request, "KubegpuInternalError", message)
                self._gate(key, refusal.message, request.scheduling_gates)
                return
        self._ungate(key)  # its last gate removed: it enters the queue as a new pod would
        if (nominee := self.engine.nominee(key)) is not None and nominee.uid != request.uid:
            # The node was held for an older pod of this name, deleted unseen (a relist): not this pod's to wait on.
            self.engine.unnominate(key)
        if self.follow_nominations and not deleting:
            status = obj.get("status")
            self._follow_nomination(request, status.get("nominatedNodeName") if isinstance(status, dict) else None)
        self._refused.pop(key, None)  # readable again: made unreadable again later, it is told again
        version = str(meta.get("resourceVersion", ""))
        if self.pending.observe(key, request, version, deleting=deleting, held=held is not None):
            self._sizes[key] = sizes_of(obj)
        else:
            self.drop_pending(key)

    def _bound_partly(self, key: str, obj: dict[str, Any], problem: str) -> tuple[PodRequest, bool] | None:
        """A pod bound to a node that kubegpu cannot read whole (a value a later Kubernetes release added): read
        without the fields of its spec that cannot be read, so that what it holds on its node stays counted (left
        out, its cpu, memory and devices would go to another pod, which the kubelet refuses). None: not bound, or
        what it holds cannot be read either."""
        spec = obj.get("spec")
        if not isinstance(spec, dict) or not spec.get("nodeName"):
            return None
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        known = self._partly.get(key)
        try:
            request, deleting, dropped = bound_pod_request(
                obj, self.engine.plugins.qualifiers, known[2] if known is not None and known[0] == uid else ()
            )
        except InputError:
            return None
        if known != (uid, problem, dropped):
            self._partly[key] = (uid, problem, dropped)
            log.warning(
                "bound pod counted without %s, which kubegpu cannot read: %s",
                ", ".join(dropped),
                problem,
                extra={"pod": key, "node": spec.get("nodeName")},
            )
        return request, deleting

    def _follow_nomination(self, pod: PodRequest, node: object) -> None:
        """Hold node `node` for the pending pod kube-scheduler nominated there (none: release the hold). A node the
        engine does not know yet takes the hold when it comes; the pod's leaving (`drop_pending`) releases it."""
        name = node if isinstance(node, str) and node else None
        if self.engine.nominated_node(pod.key) == name:
            return
        if name is None:
            self.engine.unnominate(pod.key)
        else:
            self.engine.nominate(pod, name)
            if self.nominated is not None:
                self.nominated(pod, name)

    def _unreadable_pod(self, kind: str, key: str, obj: dict[str, Any], problem: str) -> None:
        """A pod kubegpu cannot read (a tenant wrote it): it is left alone, and if it was waiting for this scheduler
        its owner is told why, once.

        A pending pod leaves the front-end's pending pods even when an earlier version of it was read: edited into
        something kubegpu cannot read (an annotation, a request), it is not placed from what it said before (a pod
        waiting at Permit gives its place back, as a deleted one does). One already placed, its Binding written, is
        left as it is: the edit came before the Binding, whose own event follows. A pending pod of another
        scheduler costs nothing more: a debug line, nothing remembered (its annotations are its scheduler's
        business: KubeGPU's `pod.alpha/DeviceInformation` logged an error at each of its status updates). Any other
        is logged at error level once per pod and problem."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        held = self.engine.placement(key)
        if kind == "DELETED" or (held is not None and held.request.uid != meta.get("uid")):
            self._refused.pop(key, None)
            self.drop_pending(key)
            if held is not None and held.request.uid == meta.get("uid") and self.pending.binding(key) is None:
                self.release(key)
            return
        spec = obj.get("spec") or {}
        pending = not spec.get("nodeName")
        if pending and held is not None and not self.engine.is_waiting(key):
            return  # placed, its Binding written: an edit from before it, whose own event follows (bound)
        if pending:
            self.drop_pending(key)
            if held is not None:  # held at Permit, no Binding written: its place goes back
                self.release(key)
            if not self.pending.answers_for(spec.get("schedulerName")):
                log.debug("another scheduler's pod not read: %s", problem, extra={"pod": key})
                return
        if self._refused.get(key) == (uid, problem):
            return
        self._refused[key] = (uid, problem)
        log.error("pod ignored: %s", problem, extra={"pod": key})
        if pending:
            pod = PodRequest(
                namespace=str(meta.get("namespace", "default")),
                name=str(meta.get("name", "")),
                uid=uid,
                containers=(),
            )
            self.binder.event(pod, "FailedScheduling", f"kubegpu cannot schedule this pod: {problem}")

    def _assume(self, request: PodRequest, node: str | None = None) -> None:
        """Count a bound pod (ledger rebuild, or a pod bound by someone else) with the devices it holds, on `node`
        (else its `spec.nodeName`: a pod this scheduler bound may be known by its request before the binding).

        Only a verified allocation holds devices (`Engine.allocation_problem`). A bound pod whose allocation is
        missing, malformed, unverified, copied or stale is counted as a pod bound without one: the devices it
        requests are set aside on its node (the kubelet admits it by count), and the devices its annotation names are
        not, so they go to other pods while the CRI shim refuses to start it.
        """
        node = node or request.node_name or ""
        raw = request.annotations.get(ALLOCATION_KEY)
        extra = {"pod": request.key, "node": node}
        if raw is not None:
            try:
                record = decode_allocation(raw)
            except AnnotationError as exc:
                problem = str(exc)
            else:
                status = self.engine.admit_bound(request, node, record)
                if status.ok:
                    self._refused.pop(request.key, None)
                    return
                problem = status.message
            self.metrics.refused_allocations.inc()
            log.warning("bound pod's allocation holds no devices: %s", problem, extra=extra)
            if self._refused.get(request.key) != (request.uid, problem):
                self._refused[request.key] = (request.uid, problem)
                self.binder.event(request, "AllocationRefused", f"kubegpu.io/allocation holds no devices: {problem}")
        if any(self.engine.plugins.owner_of(r) for r in request.requested_resources()):
            if self._admit_by_count(request, node):
                self.pending.wake_for(request)
            return
        status = self.engine.admit_bound(request, node, None)
        if not status.ok:
            log.error("bound pod could not be counted: %s", status.message, extra=extra)
        else:
            self.pending.wake_for(request)


DECODERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "deviceclasses": dra.device_class,
    "resourceslices": dra.resource_slice,
    "resourceclaimtemplates": dra.resource_claim_template,
    "resourceclaims": dra.resource_claim,
}


def _results(allocation: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The devices an allocation names, as (request, driver, pool, device)."""
    results = (allocation.get("devices") or {}).get("results") or ()
    return [(r.get("request"), r.get("driver"), r.get("pool"), r.get("device")) for r in results]


def _claimed(request: PodRequest) -> AllocationRecord | None:
    """The allocation a bound pod's annotation claims, not yet checked (None: none, or not one kubegpu can read)."""
    raw = request.annotations.get(ALLOCATION_KEY)
    try:
        return decode_allocation(raw) if raw is not None else None
    except AnnotationError:
        return None


def _uid(obj: object) -> str:
    """A listed or watched object's uid ("" when it has none that can be read)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return str(meta.get("uid", "")) if isinstance(meta, dict) else ""
