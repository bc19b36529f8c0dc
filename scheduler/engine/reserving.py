"""The Reserve extension point: on the node a cycle decided (or kube-scheduler did, through the extender), each
owning plugin allocates concrete devices, held atomically (all plugins or none), and the allocation is signed for the
node side to verify. `reserve` and `unreserve` are idempotent, so a front-end may retry either, and `unreserve` gives
back only what this very pod holds: a front-end never undoes a reservation it did not make.
"""

from __future__ import annotations

import json
import time

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    MAX_ANNOTATION_BYTES,
    AllocationRecord,
    encode_allocation,
    merge_allocations,
    sign_allocation,
)
from kubegpu.core.answers import WrongAnswer
from kubegpu.core.models import PluginAllocation, PodRequest
from kubegpu.core.plugin_manager import PluginHookError
from kubegpu.core.status import Code, Status
from kubegpu.scheduler.engine.records import Decision, NodeRecord, Plan, PodRecord, named_devices
from kubegpu.scheduler.engine.scoring import Scoring


class Reserving(Scoring):
    """Reserve and Unreserve: holding a decided pod's devices, and giving them back."""

    def reserve(self, pod: PodRequest, name: str, *, placing: bool = True) -> Decision:
        """Reserve: re-check the fit on node `name`, then allocate the pod's devices there and hold them, atomically
        (all plugins or none). Idempotent: reserving again what this very pod (same UID) already holds on `name`
        answers the same decision and takes nothing more. The extender's bind verb uses this after kube-scheduler
        decided; `admit_by_count` with `placing` false, for a pod already bound there."""
        record = self.nodes.get(name)
        if record is None:
            return Decision(pod.key, False, reason=f"node {name} is unknown", code=Code.UNRESOLVABLE)
        held = self.pods.get(pod.key)
        if held is not None:
            if held.node == name and held.request.uid == pod.uid and not held.by_count:
                return Decision(
                    pod.key,
                    True,
                    node=name,
                    allocation=held.allocation,
                    annotations=dict(held.annotations),
                    claims=held.claims.shown() if held.claims is not None else {},
                )
            return Decision(
                pod.key, False, reason=f"pod {pod.key} already holds resources on a node", code=Code.UNRESOLVABLE
            )
        plan = self.plan(pod)
        status = self.check(record, pod, plan, placing=placing)
        if not status.ok:
            return Decision(pod.key, False, reason=status.message, code=status.code)
        return self._allocate_and_hold(record, pod, plan)

    def _allocate_refused(self, status: Status, parts: dict[str, PluginAllocation]) -> str:
        """The reason for a fresh allocation that the books refused. A plugin whose own take refuses what its allocate
        just chose, on a node where its fit succeeded (a share on a full device, an id the node lacks), broke "fit
        succeeds exactly when allocate finds a set": that is the plugin's failure in allocate, named and counted as
        one, rather than its take's words alone ("device card9 does not exist on this node"), which read as the
        pod's or the node's fault. A take that raised or answered wrongly is named as it is."""
        plugin = status.plugin
        if plugin not in parts or status.message.startswith(f"plugin {plugin!r} failed"):
            return status.message
        problem = WrongAnswer(
            f"its own kubegpu_scheduler_take refused the allocation it answered ({status.message}); allocate must "
            "choose devices the node's books can take, as fit found them"
        )
        return str(self.plugins.failed(plugin, "kubegpu_scheduler_allocate", problem))

    def _held_by_another(self, record: NodeRecord, pod: PodRequest, parts: dict[str, PluginAllocation]) -> str | None:
        """Why a fresh allocation may not be held, when it names a device another live pod on the node holds: the
        reason, counted as the plugin's failure in allocate; None when it names none. The plugin's own `take` is the
        first guard; this one holds whatever a plugin's books say (a take that checks nothing, books that lost a
        holder), so that no device is given to two pods. A device is named by (plugin, resource, id) (`named_devices`,
        kept per node in `NodeRecord.held`); it is held whole unless the pod's `shares` for that container name it,
        and a shared device may be shared again, never held whole beside another pod. Pods set aside by count or left
        holding nothing (`unheld`) hold no named device. What one plugin's resources mean to each other (a device and
        its cores) is its books' concern."""
        held = record.held
        if not held:
            return None
        for (plugin, resource, device), whole in named_devices(parts):
            holders = held.get((plugin, resource, device))
            if not holders:
                continue
            for key, other_whole in holders.items():
                if key == pod.key or key in record.unheld or (not whole and not other_whole):
                    continue
                other = self.pods.get(key)
                if other is None or other.by_count:
                    continue
                container = next(c for c, r in parts[plugin].containers.items() if device in r.get(resource, ()))
                problem = WrongAnswer(
                    f"named {resource} device {device!r} for container {container}, which pod {key} already holds on "
                    "this node; allocate must choose devices no other pod holds"
                )
                return str(self.plugins.failed(plugin, "kubegpu_scheduler_allocate", problem))
        return None

    def _too_large(self, parts: dict[str, PluginAllocation], written: int) -> str:
        """The reason for an allocation whose annotations, merged and signed, come to `written` bytes, past what the
        API server allows for all of a pod's annotations (and the node side's decoder reads): each plugin's part was
        within it on its own (`kubegpu.core.answers`), its node, pod UID, stamp, signature or another plugin's part
        took it over. The plugin writing the most is named and counted as failing in allocate: the pod was bound,
        then refused by the API server or on its node."""

        def size(part: PluginAllocation) -> int:
            encoded = json.dumps([part.containers, part.shares, part.fields], separators=(",", ":"))
            return len(encoded) + sum(len(k) + len(v.encode("utf-8")) for k, v in part.annotations.items())

        plugin = max(parts, key=lambda name: size(parts[name]))
        problem = WrongAnswer(
            f"returned an allocation of about {size(parts[plugin])} bytes; with the rest of the pod's allocation it "
            f"comes to {written} bytes of annotations, more than the {MAX_ANNOTATION_BYTES} the API server allows for "
            "all of a pod's annotations"
        )
        return str(self.plugins.failed(plugin, "kubegpu_scheduler_allocate", problem))

    def unreserve(self, pod: PodRequest, name: str | None = None) -> bool:
        """Unreserve: give back what `reserve` holds for this very pod (same UID), on node `name` when given (a
        failed Binding's rollback). Idempotent: False, and nothing changes, when the pod holds nothing, or when what
        is held under its key is another pod's (a newer pod of the same name) or on another node."""
        held = self.pods.get(pod.key)
        if held is None or held.request.uid != pod.uid or (name is not None and held.node != name):
            return False
        self.release(pod.key)
        return True

    def _allocate_and_hold(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> Decision:
        """Each owning plugin allocates concrete devices on the chosen node; all are held, or none; the allocation
        is signed and entered in the ledger."""
        name = record.name
        parts: dict[str, PluginAllocation] = {}
        for plugin, _ in plan.devices:
            try:
                allocation = self.plugins.call(
                    plugin,
                    "kubegpu_scheduler_allocate",
                    state=record.states[plugin],
                    pod=pod,
                    prepared=plan.prepared.get(plugin),
                )
            except PluginHookError as exc:
                return Decision(pod.key, False, reason=str(exc), code=Code.ERROR)
            if allocation is None:
                return Decision(
                    pod.key,
                    False,
                    reason=f"plugin {plugin!r} could not allocate devices on {name}",
                    code=Code.UNSCHEDULABLE,
                )
            parts[plugin] = allocation
        clash = self._held_by_another(record, pod, parts)
        if clash is not None:
            return Decision(pod.key, False, reason=clash, code=Code.ERROR)
        claims = None
        if pod.resource_claims and self._dra_on:
            # DynamicResources' Reserve: the devices of the claims not yet allocated, chosen on this node.
            outcome = self.dra.allocate(name, record.info.labels, pod)
            if isinstance(outcome, Status):
                return Decision(pod.key, False, reason=outcome.message, code=outcome.code)
            claims = outcome
        status = self._hold_devices(record, pod, parts)
        if not status.ok:
            return Decision(pod.key, False, reason=self._allocate_refused(status, parts), code=status.code)
        annotations: dict[str, str] = {}
        allocation_record: AllocationRecord | None = None
        if parts:
            if self.signing_key is None:
                allocation_record = merge_allocations(
                    name, pod.uid, list(parts.values()), init=pod.init_steps, qualifiers=self.plugins.qualifiers
                )
            else:
                self._issued = max(time.time_ns(), self._issued + 1)
                allocation_record = merge_allocations(
                    name,
                    pod.uid,
                    list(parts.values()),
                    issued=self._issued,
                    init=pod.init_steps,
                    qualifiers=self.plugins.qualifiers,
                )
                allocation_record = sign_allocation(allocation_record, self.signing_key)
            for part in parts.values():
                annotations.update(part.annotations)
            annotations[ALLOCATION_KEY] = encode_allocation(allocation_record)
            written = sum(len(key) + len(value.encode("utf-8")) for key, value in annotations.items())
            if written > MAX_ANNOTATION_BYTES:
                for plugin, part in parts.items():
                    self._give_back_devices(record, plugin, pod.key, part)
                return Decision(pod.key, False, reason=self._too_large(parts, written), code=Code.ERROR)
        self._enter(record, PodRecord(pod, name, parts, allocation_record, annotations, claims=claims))
        return Decision(
            pod.key,
            True,
            node=name,
            allocation=allocation_record,
            annotations=annotations,
            claims=claims.shown() if claims is not None else {},
        )
