"""Admission of pods that are already bound (a restart, or pods bound by someone else): a verified allocation is
held as it is (`admit_bound`); a pod without one is held by count (`admit_by_count`), or by the exact device ids its
node side published (`set_held_devices`). The opposite of kube-scheduler's AssumePod, which records a decision before
its binding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    AllocationRecord,
)
from kubegpu.core.manifests import is_extended_resource
from kubegpu.core.models import (
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.status import Status
from kubegpu.scheduler.engine.cycle import Cycle
from kubegpu.scheduler.engine.records import Decision, NodeRecord, PodRecord, log


class Admission(Cycle):
    """Recording pods that are already bound."""

    def admit_bound(self, pod: PodRequest, name: str, allocation: AllocationRecord | None) -> Status:
        """Record a pod that is already bound (restart, or a pod bound by someone else) with its allocation.

        Only a verified allocation (`allocation_problem`) is taken. Its devices are split by owning plugin and taken
        atomically; a device that is unknown is refused with a reason, and nothing is taken. When a device is held by
        another pod, the allocation the scheduler issued later wins (`issued`): the earlier one is stale (its
        devices were given out again after it was rolled back or replayed), so its pod is displaced from the ledger
        and holds nothing; a stale allocation arriving second is refused. An engine without a signing key (`kubegpu
        top` without a key file) verifies nothing, and a stamp nobody verified settles nothing: there an allocation
        naming a held device is refused, naming the holders, and displaces no one.
        """
        if pod.key in self.pods:
            return Status.error(f"pod {pod.key} already holds resources")
        record = self.nodes.get(name)
        if record is None:
            return Status.error(f"node {name} is unknown")
        parts: dict[str, PluginAllocation] = {}
        if allocation is not None:
            problem = self.allocation_problem(pod, name, allocation)
            if problem is not None:
                return Status.error(f"the {ALLOCATION_KEY} of pod {pod.key} holds no devices: {problem}")
            parts = self._split(allocation)
        status = self._hold_devices(record, pod, parts)
        if not status.ok and allocation is not None:
            rivals = self._holders_of(record, allocation)
            if self.signing_key is None and rivals:
                claimants = ", ".join(p.request.key for p in rivals)
                return Status.error(
                    f"the {ALLOCATION_KEY} of pod {pod.key} names devices that {claimants} also claim; neither is "
                    "verified (no key), so neither displaces the other"
                )
            newer = [
                p.request.key
                for p in rivals
                if not p.by_count and p.allocation is not None and p.allocation.issued >= allocation.issued
            ]
            if newer:
                return Status.error(
                    f"the {ALLOCATION_KEY} of pod {pod.key} (issued {allocation.issued}) is stale: its devices are "
                    f"held by {', '.join(newer)}, whose allocation the scheduler issued later"
                )
            # Set aside, not released, until the pod takes their devices: a rival waiting at Permit (a gang member)
            # put back must still wait there, its timeout counting, or it held its place waiting for nothing
            # (security T180).
            displaced = [held for p in rivals if (held := self._set_aside(p.request.key)) is not None]
            status = self._hold_devices(record, pod, parts)
            if status.ok:
                self._enter(record, self._admitted(pod, name, parts, allocation))
            for held in displaced:
                if not status.ok:
                    self._put_back(held)
                elif held.by_count:
                    self.admit_by_count(held.request, name)
                else:
                    self.release(held.request.key)  # holds nothing: whatever else of it is kept goes (its wait)
                    self.on_verify_keys.discard(held.request.key)  # set aside, it was still counted
                    log.warning(
                        "allocation is stale: a later allocation (issued %d) holds its devices; the pod holds none",
                        allocation.issued,
                        extra={"pod": held.request.key, "node": name},
                    )
            return status
        if not status.ok:
            return status
        self._enter(record, self._admitted(pod, name, parts, allocation))
        return Status.success()

    def _admitted(
        self, pod: PodRequest, name: str, parts: dict[str, PluginAllocation], allocation: AllocationRecord | None
    ) -> PodRecord:
        """The ledger entry of a bound pod admitted with `allocation`, marked where only a verify key verifies it
        (`Engine.on_verify_keys`: the operator rotating the key keeps that key until no such pod is left)."""
        by_verify_key = allocation is not None and self.needs_verify_key(pod, name, allocation)
        return PodRecord(pod, name, parts, allocation, {}, by_verify_key=by_verify_key)

    def admit_by_count(self, pod: PodRequest, name: str) -> Decision:
        """Set devices aside by count for a pod bound to `name` without a verified allocation (bound by another
        scheduler, or carrying a claim that does not verify): the kubelet admits it by count, so its count is not
        free, but no container was given these particular devices, so a verified allocation may take them over.

        When the node side published the ids the kubelet gave this pod (`set_held_devices`), the pod holds exactly
        those instead, and nothing may take them over."""
        record = self.nodes.get(name)
        exact = self._published.get(name, {}).get(pod.key)
        if (
            exact is not None
            and record is not None
            and pod.key not in self.pods
            and self._admit_exact(record, pod, exact)
        ):
            return Decision(pod.key, True, node=name)
        admitted = self._as_admitted(pod, record) if record is not None else pod
        decision = self.reserve(admitted, name, placing=False)
        if decision.scheduled:
            if admitted is not pod:
                self.update_bound(pod)  # the pod as it is (its node's usage too), holding what its count set aside
            self.pods[pod.key].by_count = True
        return decision

    def _as_admitted(self, pod: PodRequest, record: NodeRecord) -> PodRequest:
        """The pod as its kubelet admitted it: without the extended resources its node does not list and no plugin
        owns (the kubelet drops them before its own fit: `removeMissingExtendedResources`, for resources a scheduler
        extender manages, such as HAMi's `nvidia.com/priority`). Counted with them, a pod the kubelet runs was held
        nowhere (`Insufficient nvidia.com/priority`, or a plugin refusing to place the pod) and the devices it holds
        went to the next pod."""
        listed = record.info.allocatable

        def dropped(resources: Mapping[str, int]) -> set[str]:
            return {
                r for r in resources if is_extended_resource(r) and r not in listed and self.plugins.owner_of(r) is None
            }

        gone = dropped(pod.requests).union(*(dropped(c.resources) for c in pod.containers))
        gone.update(*(dropped(s.resources) for s in pod.init_steps))
        if not gone:
            return pod

        def kept(resources: Mapping[str, int]) -> dict[str, int]:
            return {r: n for r, n in resources.items() if r not in gone}

        return replace(
            pod,
            containers=tuple(replace(c, resources=kept(c.resources)) for c in pod.containers),
            init_steps=tuple(replace(s, resources=kept(s.resources)) for s in pod.init_steps),
            requests=kept(pod.requests),
        )

    def _admit_exact(self, record: NodeRecord, pod: PodRequest, containers: dict[str, dict[str, list[str]]]) -> bool:
        """Take exactly the published ids for a pod kubegpu did not place; False (nothing taken) when they do not fit.
        Devices set aside by count for other pods may be these very ids: those pods are held again around them."""
        parts: dict[str, PluginAllocation] = {}
        for container, resources in containers.items():
            for resource, ids in resources.items():
                plugin = self.plugins.owner_of(resource)
                if plugin is None or plugin not in record.states:
                    continue
                part = parts.setdefault(plugin, PluginAllocation(plugin=plugin))
                part.containers.setdefault(container, {})[resource] = list(ids)
        if not parts:
            return False
        status = self._hold_devices(record, pod, parts)
        if status.ok:
            self._enter(record, PodRecord(pod, record.name, parts, None, {}))
            return True
        keys = [key for key in record.pods if self.pods[key].by_count]
        movable = [held for key in keys if (held := self.release(key)) is not None]
        status = self._hold_devices(record, pod, parts)
        if status.ok:
            self._enter(record, PodRecord(pod, record.name, parts, None, {}))
        else:
            log.warning(
                "the devices the kubelet reports for the pod do not fit kubegpu's ledger; held by count: %s",
                status.message,
                extra={"pod": pod.key, "node": record.name},
            )
        for held in movable:
            if not self.admit_by_count(held.request, record.name).scheduled:
                log.error("pod held by count no longer fits its node", extra={"pod": held.request.key})
        return status.ok

    def set_held_devices(self, name: str, held: Mapping[str, Mapping[str, Mapping[str, Sequence[str]]]]) -> list[str]:
        """The device ids node `name`'s kubelet gave pods that kubegpu did not place, as its PodResources API reports
        them (published by the node side as `kubegpu.io/foreign-devices`): pod key -> container -> resource -> ids.
        A pod held by count there (`admit_by_count`) whose ids are published holds exactly those from now on, and so
        does one held later. Returns the keys of the pods moved from a count to exact ids."""
        table = {
            key: {container: {r: [str(i) for i in ids] for r, ids in per.items()} for container, per in pod.items()}
            for key, pod in held.items()
        }
        if self._published.get(name, {}) == table:
            return []
        if table:
            self._published[name] = table
        else:
            self._published.pop(name, None)
        record = self.nodes.get(name)
        if record is None:
            return []
        moved = []
        for key in [k for k in record.pods if self.pods[k].by_count and k in table]:
            released = self.release(key)
            if released is None:
                continue
            if not self.admit_by_count(released.request, name).scheduled:
                self._put_back(released)
            elif not self.pods[key].by_count:
                moved.append(key)
        return moved
