"""What the front-ends read: values and read-only views, never the records themselves
(tests/scheduler/test_front_end_boundary.py holds this).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, KeysView

from kubegpu.core.dra import Claim
from kubegpu.core.models import (
    NodeInfo,
    Occupancy,
    PodRequest,
)
from kubegpu.core.plugin_manager import PluginHookError
from kubegpu.core.scheduler_hooks import DeviceNodeState
from kubegpu.core.status import Status
from kubegpu.scheduler.dra import HeldClaim
from kubegpu.scheduler.engine.framework import QueueSortPlugin
from kubegpu.scheduler.engine.gangs import Gangs
from kubegpu.scheduler.engine.records import Placement, PodRecord, Waiting, log
from kubegpu.scheduler.podgroups import PodGroup


class Queries(Gangs):
    """Read-only queries for the front-ends."""

    def pre_enqueue(self, pod: PodRequest) -> Status | None:
        """PreEnqueue: None when `pod` may enter the scheduling queue, else the first enabled rule's refusal (a
        gated pod: "SchedulingGated: waiting for scheduling gates: [a b]"); the front-end keeps the pod out of its
        queue until an update makes this None."""
        for plugin in self._pre_enqueue:
            status = plugin.pre_enqueue(pod)
            if status is not None:
                return status
        return None

    @property
    def queue_sort(self) -> QueueSortPlugin:
        """The profile's QueueSort plugin (PrioritySort unless a profile names another), for a front-end's queue."""
        return self._queue_sort

    def node_names(self) -> KeysView[str]:
        """The nodes the engine knows, as a live view (`in` and set operations work on it; no copy)."""
        return self.nodes.keys()

    def node_info(self, name: str) -> NodeInfo | None:
        """Node `name` as it was last added (None: unknown), so a front-end can tell whether a Node changed."""
        record = self.nodes.get(name)
        return record.info if record is not None else None

    def has_devices(self, name: str) -> bool:
        """Whether some plugin keeps device state for node `name`."""
        record = self.nodes.get(name)
        return record is not None and bool(record.states)

    def device_state(self, name: str, plugin: str) -> DeviceNodeState | None:
        """`plugin`'s device state for node `name` (None: unknown node, or none kept there), for a view in that
        plugin's own terms (`compat`'s GpuNode). Read it only: the engine changes it as pods come and go."""
        record = self.nodes.get(name)
        return record.states.get(plugin) if record is not None else None

    def holders(self, name: str) -> list[str]:
        """The pods holding resources on node `name`, in the order they were placed (none for an unknown node)."""
        record = self.nodes.get(name)
        return list(record.pods) if record is not None else []

    def pod_keys(self) -> KeysView[str]:
        """The pods that hold resources on some node, as a live view (no copy)."""
        return self.pods.keys()

    def placement(self, key: str) -> Placement | None:
        """Where pod `key` holds resources and what it took; None when it holds none."""
        record = self.pods.get(key)
        return None if record is None else _placement(record)

    def held_claims(self, key: str) -> list[HeldClaim]:
        """The DRA claims pod `key` holds, each allocated and reserved for it (none when it holds none): those its
        Reserve made, or for a bound pod counted without being placed here (a restart), those the cluster says are
        reserved for it."""
        record = self.pods.get(key)
        if record is None:
            return []
        claims = record.claims
        if claims is None and record.request.resource_claims:
            claims = self.dra.reserved_by(record.request)
        return claims.held() if claims is not None else []

    def resource_claim(self, namespace: str, name: str) -> Claim | None:
        """The ResourceClaim as the engine holds it: as last reported, or as a pod's Reserve made it."""
        return self.dra.claims.get((namespace, name))

    def dra_keys(self, collection: str) -> list[tuple[str, str]]:
        """The DRA objects the engine knows of one collection (`deviceclasses`, `resourceslices`,
        `resourceclaimtemplates`, `resourceclaims`), as (namespace, name); cluster-scoped ones with namespace ""."""
        book = self.dra
        if collection == "deviceclasses":
            return [("", name) for name in book.classes]
        if collection == "resourceslices":
            return [("", name) for name in book.slices]
        if collection == "resourceclaimtemplates":
            return list(book.templates)
        return list(book.claims)

    def placements(self, keys: Iterable[str] | None = None) -> Iterator[Placement]:
        """The placements of those of `keys` that hold resources, in their order (None: of every pod that does)."""
        for key in self.pods if keys is None else keys:
            record = self.pods.get(key)
            if record is not None:
                yield _placement(record)

    def waiting_pods(self) -> list[Waiting]:
        """The pods waiting at Permit whose reservations still hold, earliest deadline first."""
        return sorted((w for w in self.waiting.values() if self._still_held(w)), key=lambda w: w.deadline)

    def pods_on_verify_keys(self) -> int:
        """How many pods hold devices by an allocation only a verify key verifies (`--allocation-verify-key-file`):
        the key being rotated out is needed until this is 0 (`kubegpu_scheduler_pods_on_verify_keys`)."""
        return len(self.on_verify_keys)

    def pod_group(self, key: str) -> PodGroup | None:
        """The PodGroup `namespace/name` as last reported (`set_pod_group`); None when none is."""
        return self.pod_groups.get(key)

    def describe(self, name: str) -> list[Occupancy]:
        record = self.nodes[name]
        pictures: list[Occupancy] = []
        for plugin, state in record.states.items():
            try:
                pictures.extend(self.plugins.call(plugin, "kubegpu_scheduler_describe", state=state) or [])
            except PluginHookError as exc:
                log.error("node %s: %s", name, exc)
        return pictures


def _placement(record: PodRecord) -> Placement:
    return Placement(record.request, record.node, record.allocation, record.by_count, record.parts)
