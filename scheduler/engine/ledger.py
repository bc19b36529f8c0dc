"""The device ledger: which plugin allocation each placed pod holds on which node, taken and given back
atomically through the plugins (`kubegpu_scheduler_take` / `kubegpu_scheduler_release`), and the check that an
allocation found on a bound pod is one this scheduler signed for it, with its key or a key being rotated
(`allocation_problem`); and the what-if on one plugin's books for a node held for a preemptor (`_devices_left`):
the same allocate, take and give back, each undone before it answers.

Pure bookkeeping over `NodeRecord.states`: no decision is made here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kubegpu.core.annotations import AllocationRecord, verifying_key
from kubegpu.core.models import (
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.plugin_manager import PluginHookError
from kubegpu.core.status import Status
from kubegpu.scheduler.engine.records import NodeRecord, PodRecord, log
from kubegpu.scheduler.engine.state import EngineState


class Ledger(EngineState):
    """Taking and giving back one pod's device allocations on one node; checking an allocation's provenance."""

    def allocation_problem(self, pod: PodRequest, name: str, allocation: AllocationRecord) -> str | None:
        """Why `allocation` may not hold devices for `pod` bound to node `name`, or None when it may.

        Pod annotations are written by tenants: only an allocation that this scheduler's key signed, for this pod's
        UID, on the node the pod is bound to, holds devices. Anything else (unsigned, forged, copied from another
        pod, naming another node) is a claim, not an allocation.
        """
        if allocation.node != name:
            return f"it names node {allocation.node!r} but the pod is bound to {name!r}"
        if allocation.podUID != pod.uid:
            return f"it was issued to the pod with UID {allocation.podUID!r}, not to this pod (UID {pod.uid!r})"
        if self.signing_key is None or verifying_key(allocation, (self.signing_key, *self.verify_keys)) is not None:
            return None
        if self.verify_keys:
            return (
                "its signature verifies with none of the scheduler's keys (--allocation-key-file and "
                "--allocation-verify-key-file: unsigned, changed, or signed elsewhere)"
            )
        return "its signature does not verify with the scheduler's key (unsigned, changed, or signed elsewhere)"

    def needs_verify_key(self, pod: PodRequest, name: str, allocation: AllocationRecord) -> bool:
        """Whether `allocation` holds devices for `pod` on node `name` only by a verify key (`--allocation-verify-key-
        file`): the operator rotating the key keeps that key while such a pod runs (`Engine.on_verify_keys`, and the
        front-ends' pods whose Node is not listed, `ClusterMirror.pods_on_verify_keys`)."""
        return bool(
            self.verify_keys
            and self.signing_key is not None
            and self.allocation_problem(pod, name, allocation) is None
            and verifying_key(allocation, (self.signing_key,)) is None
        )

    def _split(self, allocation: AllocationRecord) -> dict[str, PluginAllocation]:
        parts: dict[str, PluginAllocation] = {}
        for container, resources in allocation.containers.items():
            for resource, ids in resources.items():
                plugin = self.plugins.owner_of(resource) or ""
                part = parts.get(plugin)
                if part is None:
                    part = parts[plugin] = PluginAllocation(
                        plugin=plugin, fields=dict(allocation.plugins.get(plugin, {}))
                    )
                part.containers.setdefault(container, {})[resource] = list(ids)
                share = allocation.shares.get(container, {}).get(resource)
                if share is not None:
                    part.shares.setdefault(container, {})[resource] = dict(share)
        return parts

    def _hold_devices(
        self, record: NodeRecord, pod: PodRequest, parts: dict[str, PluginAllocation], *, teaches: bool = True
    ) -> Status:
        """Hold the pod's allocation on the node, plugin by plugin (`kubegpu_scheduler_take`): all, or none and the
        first refusal. "Hold" is the engine's one verb for devices a pod has; `_give_back_devices` undoes it.
        `teaches` false: a pod held before is held again (put back after a what-if, or on its node's new record),
        and the take is given no pod, so that no plugin learns it twice (a mix counting it at each preemption search
        or node update would drift toward the pods that happen to sit where those run)."""
        taken: list[str] = []
        for plugin, part in parts.items():
            state = record.states.get(plugin) if plugin else None
            if state is None:
                status = Status.error(f"node {record.name} has no devices for plugin {plugin or '(none)'!r}")
            else:
                try:
                    status = self.plugins.call(
                        plugin,
                        "kubegpu_scheduler_take",
                        state=state,
                        pod_key=pod.key,
                        allocation=part,
                        pod=pod if teaches else None,
                    ) or Status.error(f"plugin {plugin!r} gave no answer to kubegpu_scheduler_take")
                except PluginHookError as exc:
                    status = Status.error(str(exc), plugin=plugin)
            if not status.ok:
                for done in taken:
                    self._give_back_devices(record, done, pod.key, parts[done])
                # The refusing plugin, for a reason that names it: its Status may not say (`plugin=` is optional),
                # nor name another plugin, which would then be blamed for this one's refusal.
                return status if status.plugin == (plugin or None) else replace(status, plugin=plugin or None)
            taken.append(plugin)
        return Status.success()

    def _give_back_devices(self, record: NodeRecord, plugin: str, key: str, part: PluginAllocation) -> None:
        try:
            status = self.plugins.call(
                plugin, "kubegpu_scheduler_release", state=record.states[plugin], pod_key=key, allocation=part
            )
        except PluginHookError as exc:
            log.error("releasing %s on %s: %s", key, record.name, exc)
            return
        if status is not None and not status.ok:
            log.error("releasing %s on %s: %s", key, record.name, status.message)

    def _devices_left(
        self,
        record: NodeRecord,
        plugin: str,
        pod: PodRequest,
        prepared: object,
        nominees: Sequence[tuple[PodRequest, object]],
    ) -> bool:
        """Whether each of `nominees` (highest priority first) still finds a valid set of `plugin`'s devices on the
        node once `pod` holds the set `reserve` would give it now and the pods being deleted there (`leaving`) are
        gone. A what-if on the plugin's books alone (allocate, take, give back: what the ledger does), each step
        undone in reverse before it returns; no node version or memo moves. A plugin that fails, or answers no set
        for the pod, counts as leaving no room: the node stays held, as it was before this rule."""
        state = record.states.get(plugin)
        if state is None:
            return False
        undo: list[tuple[str, PluginAllocation, PodRequest | None]] = []  # (key, part, None: release; else: take)
        try:
            part = self._what_if_allocate(state, plugin, pod, prepared)
            if part is None or not self._what_if_take(state, plugin, pod, part):
                return False
            undo.append((pod.key, part, None))
            for key in record.pods:
                if key in self.leaving and key not in record.unheld:
                    held = self.pods[key]
                    given = held.parts.get(plugin)
                    if given is not None and self._what_if_release(state, plugin, key, given):
                        undo.append((key, given, held.request))
            for nominee, asked in nominees:
                theirs = self._what_if_allocate(state, plugin, nominee, asked)
                if theirs is None or not self._what_if_take(state, plugin, nominee, theirs):
                    return False
                undo.append((nominee.key, theirs, None))
            return True
        finally:
            for key, given, request in reversed(undo):
                if request is None:
                    self._what_if_release(state, plugin, key, given)
                elif not self._what_if_take(state, plugin, request, given):
                    log.error("could not restore %s on %s after a nominee's what-if", key, record.name)

    def _what_if_allocate(
        self, state: object, plugin: str, pod: PodRequest, prepared: object
    ) -> PluginAllocation | None:
        if isinstance(prepared, PluginHookError):
            return None
        try:
            fit = self.plugins.call(plugin, "kubegpu_scheduler_fit", state=state, pod=pod, prepared=prepared)
            if fit is None or not fit.ok:
                return None
            allocation: PluginAllocation | None = self.plugins.call(
                plugin, "kubegpu_scheduler_allocate", state=state, pod=pod, prepared=prepared
            )
        except PluginHookError as exc:
            log.error("a nominee's what-if on %s: %s", plugin, exc)
            return None
        return allocation

    def _what_if_take(self, state: object, plugin: str, pod: PodRequest, part: PluginAllocation) -> bool:
        """A take the what-if undoes: given no pod, so that no plugin learns from it (`_hold_devices`)."""
        try:
            status = self.plugins.call(
                plugin, "kubegpu_scheduler_take", state=state, pod_key=pod.key, allocation=part, pod=None
            )
        except PluginHookError as exc:
            log.error("a nominee's what-if on %s: %s", plugin, exc)
            return False
        return status is not None and bool(status.ok)

    def _what_if_release(self, state: object, plugin: str, key: str, part: PluginAllocation) -> bool:
        try:
            status = self.plugins.call(plugin, "kubegpu_scheduler_release", state=state, pod_key=key, allocation=part)
        except PluginHookError as exc:
            log.error("a nominee's what-if on %s: %s", plugin, exc)
            return False
        return status is None or bool(status.ok)

    def _holders_of(self, record: NodeRecord, allocation: AllocationRecord) -> list[PodRecord]:
        """The pods on the node whose allocations name a whole device of `allocation`."""
        wanted = whole_devices(allocation)
        holders = []
        for key in record.pods:
            held = self.pods[key]
            if held.allocation is not None and not wanted.isdisjoint(whole_devices(held.allocation)):
                holders.append(held)
        return holders


def whole_devices(allocation: AllocationRecord) -> set[tuple[str, str]]:
    """(resource, device id) of each whole device in an allocation (shared ones, with `shares`, have co-holders)."""
    return {
        (resource, device)
        for container, resources in allocation.containers.items()
        for resource, ids in resources.items()
        if resource not in allocation.shares.get(container, {})
        for device in ids
    }
