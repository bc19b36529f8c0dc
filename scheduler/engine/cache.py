"""The node cache (kube-scheduler's `internal/cache`): a `NodeRecord` per node with each plugin's device
state, its headroom and usage; the capacity indexes, node classes (`classes`) and node tree a cycle selects
candidates from; the numbered change log (`changed_since`) every memo keyed by a node's version or the generation is
checked against; and placing and releasing a pod's usage there (`_enter`, `release`, `pods_removed`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from kubegpu.core.kit import shares_devices
from kubegpu.core.limits import check_device_count
from kubegpu.core.models import (
    NodeInfo,
    PodRequest,
)
from kubegpu.core.plugin_manager import PluginHookError
from kubegpu.core.scheduler_hooks import Headroom
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine.classes import NodeClasses
from kubegpu.scheduler.engine.records import (
    CPU_INDEX,
    DRA_INDEX,
    UNKNOWN_FREE,
    NodeRecord,
    PodRecord,
    log,
)
from kubegpu.scheduler.index import CapacityIndex, zone_key

MAX_CHANGES = 1 << 16  # node changes remembered by `changed_since`
CPU_MEMORY = frozenset({"cpu", "memory"})


class NodeCache(NodeClasses):
    """Nodes, their usage and indexes, and the change log."""

    def add_node(self, info: NodeInfo) -> None:
        """Add a node, or replace it (a changed Node), keeping the pods placed on it."""
        previous = self.nodes.get(info.name)
        digest = self.node_digest(info)
        record = NodeRecord(info, klass=self._klass(info, digest), digest=digest)
        self._replaced = (previous.info, previous.digest) if previous is not None else None
        self._node_epoch += 1
        for plugin in self.plugins.names:
            inventory = info.inventories.get(plugin)
            try:
                # Refused here, for every plugin, before it builds per-device structures (`kubegpu.core.limits`).
                check_device_count(
                    info.name, f"advertised {plugin} devices", len(inventory.devices if inventory else ())
                )
            except ValueError as exc:
                log.error("%s", exc)
                record.problems[plugin] = str(exc)
                continue
            try:
                state = self.plugins.call(
                    plugin, "kubegpu_scheduler_build_node", node=info, shared=self._shared.setdefault(plugin, {})
                )
            except PluginHookError as exc:
                problem = exc.on_node(info.name)
                log.error("%s", problem)
                record.problems[plugin] = str(problem)
                continue
            if state is not None:
                record.states[plugin] = state
        if previous is not None:
            self._count_fragmenting(previous, -1)
        self._count_fragmenting(record, +1)
        self.nodes[info.name] = record
        self._tree.set(info.name, zone_key(info.labels))
        self._join_class(info.name, previous.klass if previous is not None else None, record.klass)
        if any(t.effect == "PreferNoSchedule" for t in info.taints):
            self._soft_tainted.add(info.name)
        else:
            self._soft_tainted.discard(info.name)
        self._note_scored(info, previous.info if previous is not None else None)
        # The holds for preempting pods and gangs stay with the node through its updates; a node first seen now takes
        # the holds of the pods nominated to it before it was known (kube-scheduler's nomination seen first).
        if previous is not None:
            record.nominees = dict(previous.nominees)
        else:
            for key, name in self.nominated.items():
                if name == info.name and (nominee := self.nominee_requests.get(key)) is not None:
                    record.nominees[key] = nominee.priority
        if previous is not None:
            for key in list(previous.pods):
                pod = self.pods[key]
                self._forget_anti(key)  # its charges went with the old record; taken again below if it still fits
                status = self._hold_devices(record, pod.request, pod.parts, teaches=False)
                if not status.ok:
                    # Still running, on devices kubegpu can no longer tell apart: dropped, its devices (those still
                    # listed) and its cpu went to the next pods while it ran. Counted, holding none, and the
                    # plugins' devices here wait until it leaves.
                    log.error("node %s changed: pod %s no longer fits its devices: %s", info.name, key, status.message)
                    record.unheld[key] = _unheld(key, status.message)
                record.pods[key] = None
                record.hold_named(key, pod.parts)
                self._count_usage(record, pod.request, +1)
        self._refresh(record)
        if previous is not None:
            self._leave_indexes(record)

    def recheck_digests(self) -> list[str]:
        """The nodes whose plugins' digests (`node_digest`) differ now from what their states were built with, built
        again (`add_node` of the same Node, keeping its pods): a digest may change with time alone (HAMi's handshake
        going stale while no Node update comes: its registration was still read, its GPUs given, as long as the node
        was left alone). The front-ends call it every `DIGEST_RECHECK` seconds; a changed node may help pending
        pods. Costs a digest per node and plugin that has one; nothing without such a plugin."""
        if not self._digesters:
            return []
        changed = [name for name, record in self.nodes.items() if self.node_digest(record.info) != record.digest]
        for name in changed:
            self.add_node(self.nodes[name].info)
        return changed

    def _leave_indexes(self, record: NodeRecord) -> None:
        """Take a changed node out of the capacity indexes of what it no longer offers (a plugin's devices gone, a
        resource its headroom no longer names): left there under its old class, a cycle in capacity order met it
        among that class's nodes, and its refusal settled the new class instead (KeyError out of the cycle)."""
        offered = {CPU_INDEX, DRA_INDEX} if self.dra.slices else {CPU_INDEX}
        for headroom in record.headroom.values():
            offered.update(headroom.free)
        for plugin in record.problems.keys() - record.states.keys():
            offered.update(self._unknown_headroom(record, plugin).free)
        for resource, index in self._index.items():
            if resource not in offered and record.name in index:
                index.discard(record.name)

    def _count_fragmenting(self, record: NodeRecord, sign: int) -> None:
        """Count a node holding a state of a plugin that measures fragmentation in (+1) or out (-1) of
        `_fragmenting_nodes`: under "" and under each plugin with a state there; and likewise in `_sharing_nodes` when
        one of those states shares its devices; and in `_fragmenting_beside`, under each plugin with a state there, each
        fragmenting plugin with one too."""
        if any(plugin in record.states for plugin in self._fragmenters):
            counts = self._fragmenting_nodes
            counts[""] += sign
            for plugin in record.states:
                counts[plugin] += sign
                beside = self._fragmenting_beside.setdefault(plugin, Counter())
                for fragmenter in self._fragmenters:
                    if fragmenter in record.states:
                        beside[fragmenter] += sign
            if any(shares_devices(state) for state in record.states.values()):
                sharing = self._sharing_nodes
                sharing[""] += sign
                for plugin in record.states:
                    sharing[plugin] += sign

    def _note_scored(self, info: NodeInfo | None, previous: NodeInfo | None) -> None:
        """Count a node's images and the controllers its `preferAvoidPods` annotation names, in place of what its
        `previous` self counted (None: a new node; `info` None: a removed one). An annotation kubegpu cannot read
        counts as absent, with one warning per value."""
        if previous is not None:
            for image, size in previous.images.items():
                self._image_nodes[image] -= 1
                if self._image_nodes[image] <= 0:
                    del self._image_nodes[image]
                    self._image_sizes.pop(image, None)
                else:
                    sizes = self._image_sizes[image]
                    sizes[size] -= 1
                    if sizes[size] <= 0:
                        del sizes[size]
            before = self._avoid.pop(previous.name, frozenset())
            self._avoided.subtract(before)
            for key in before:
                if self._avoided[key] <= 0:
                    del self._avoided[key]
        if info is None:
            return
        for image, size in info.images.items():
            self._image_nodes[image] += 1
            self._image_sizes.setdefault(image, Counter())[size] += 1
        raw = info.annotations.get(scores.PREFER_AVOID_KEY)
        if raw is None:
            return
        if previous is not None and previous.annotations.get(scores.PREFER_AVOID_KEY) == raw:
            avoided = before  # unchanged: read once (and warned about once)
        else:
            try:
                avoided = scores.avoided_controllers(raw)
            except ValueError as exc:
                log.warning("node %s: annotation %s ignored: %s", info.name, scores.PREFER_AVOID_KEY, exc)
                return
        if avoided:
            self._avoid[info.name] = avoided
            self._avoided.update(avoided)

    def remove_node(self, name: str) -> list[str]:
        """Remove a node; the pods it held are forgotten (their devices went with it). Returns their keys."""
        record = self.nodes.pop(name, None)
        self._dead.pop(name, None)
        self._published.pop(name, None)
        self._digest_failing.difference_update((plugin, name) for plugin in self._digesters)
        if record is None:
            return []
        self._node_epoch += 1
        self._count_fragmenting(record, -1)
        self._soft_tainted.discard(name)
        self._note_scored(None, record.info)
        self._join_class(name, record.klass, None)
        self._tree.discard(name)
        self._changed(name)
        # The memos by node name that hold its record (the others follow the change log): a node gone under a name
        # never seen again (an autoscaler's) would stay in them.
        self._contents.pop(name, None)
        self._numbering.by_node.pop(name, None)
        for index in self._index.values():
            index.discard(name)
        gone = list(record.pods)
        for key in gone:
            self.pods.pop(key, None)
            self.on_verify_keys.discard(key)  # or the old key's gauge never reaches 0 after a node is removed
            self.leaving.discard(key)
            self._forget_anti(key)
        return gone

    def _forget_anti(self, key: str) -> None:
        """A pod that held resources is gone without being charged back (its node went, or changed under it): it
        leaves the index of placed pods and the count of placed priorities."""
        held = self._placed.pods.get(key)
        self._placed.discard(key)
        if held is not None:
            self._count_priority(held.priority, -1)
            if held.pod_anti_affinity:
                self._anti_epoch += 1

    def _count_priority(self, priority: int, sign: int) -> None:
        """Count a placed pod's priority in (+1) or out (-1); a priority no placed pod has any more goes (preemption's
        quick no reads every priority kept)."""
        count = self._priorities[priority] + sign
        if count > 0:
            self._priorities[priority] = count
        else:
            self._priorities.pop(priority, None)

    def _changed(self, name: str) -> None:
        self.generation += 1
        self._changes.append(name)
        if len(self._changes) > MAX_CHANGES:
            drop = len(self._changes) // 2
            del self._changes[:drop]
            self._first += drop

    def changed_since(self, generation: int) -> set[str] | None:
        """The nodes changed (added, removed, used or freed) after change number `generation`, or None when that is
        too long ago to tell."""
        if generation < self._first:
            return None
        return set(self._changes[generation - self._first :])

    def _refresh(self, record: NodeRecord) -> None:
        """Recompute the node's headroom after a change and move it in the capacity indexes."""
        self._changed(record.name)
        record.version += 1
        name = record.name
        self._index[CPU_INDEX].set(name, record.free("cpu"), record.klass)
        if self.dra.slices:
            self._index.setdefault(DRA_INDEX, CapacityIndex()).set(name, self.dra.free_devices(name), record.klass)
        if record.problems:
            for plugin in record.problems.keys() - record.states.keys():  # build_node failed
                for resource in self._unknown_headroom(record, plugin).free:
                    self._index.setdefault(resource, CapacityIndex()).set(name, UNKNOWN_FREE, record.klass)
        for plugin, state in record.states.items():
            try:
                headroom = self.plugins.call(plugin, "kubegpu_scheduler_headroom", state=state) or Headroom()
                record.problems.pop(plugin, None)
            except PluginHookError as exc:
                problem = exc.on_node(name)
                log.error("%s", problem)
                record.problems[plugin] = str(problem)
                headroom = self._unknown_headroom(record, plugin)
            old = record.headroom.get(plugin)
            record.headroom[plugin] = headroom
            if old is not None:
                for resource in old.free.keys() - headroom.free.keys():
                    self._index[resource].discard(name)
            for resource, free in headroom.free.items():
                index = self._index.get(resource)
                if index is None:
                    index = self._index[resource] = CapacityIndex()
                index.set(name, free, record.klass)
        if record.unheld:
            for key, why in record.unheld.items():
                for plugin in self.pods[key].parts:
                    if plugin in record.states:
                        record.problems[plugin] = why

    def _unknown_headroom(self, record: NodeRecord, plugin: str) -> Headroom:
        """Headroom for a plugin that failed on the node: every resource it could own there looks free, so the
        node stays a candidate and its pods are told the failure (`_device_fit`) rather than `Insufficient ...`."""
        claimed = self.plugins.records[plugin].resources if plugin in self.plugins.records else []
        resources = {r for r in claimed if not r.endswith("/*")}
        resources.update(r for r in record.info.allocatable if self.plugins.owner_of(r) == plugin)
        return Headroom(free=dict.fromkeys(sorted(resources), UNKNOWN_FREE))

    def _count_usage(self, record: NodeRecord, pod: PodRequest, sign: int) -> None:
        """Add (`sign` +1) or remove (-1) the pod in the node's usage (`count_on_node`), and in the index of placed
        pods and the count of their priorities."""
        count_on_node(record, pod, sign)
        cpu, memory = scores.nonzero_requests(pod)
        record.nonzero_cpu += sign * cpu
        record.nonzero_memory += sign * memory
        self._count_priority(pod.priority, sign)
        if sign > 0:
            self._placed.add(pod.key, pod, record.name)
        else:
            self._placed.discard(pod.key)
        if pod.pod_anti_affinity:
            self._anti_epoch += 1

    def _enter(self, record: NodeRecord, pod_record: PodRecord) -> None:
        """Enter a pod whose devices are held (`_hold_devices`) in the ledger and the node's usage; a nomination
        the pod had ends."""
        key = pod_record.request.key
        nominated = self.nominated.pop(key, None)
        self.nominee_requests.pop(key, None)
        if nominated is not None and (held := self.nodes.get(nominated)) is not None:
            held.nominees.pop(key, None)
            if held is not record:
                self._refresh(held)
        self.pods[key] = pod_record
        if pod_record.by_verify_key:
            self.on_verify_keys.add(key)
        record.pods[key] = None
        record.hold_named(key, pod_record.parts)
        self._count_usage(record, pod_record.request, +1)
        if pod_record.claims is not None:
            self._refresh_others(record, self.dra.hold(pod_record.claims))
        self._refresh(record)

    def release(self, key: str) -> PodRecord | None:
        """Forget a pod (deleted, finished, or its binding rolled back) and return exactly what it held."""
        pod_record = self.pods.pop(key, None)
        if pod_record is None:
            return None
        self.on_verify_keys.discard(key)
        if pod_record.claims is None and pod_record.request.resource_claims:
            pod_record.claims = self.dra.reserved_by(pod_record.request)  # counted bound, not placed here
        record = self.nodes.get(pod_record.node)
        if record is None:
            self._forget_anti(key)
            if pod_record.claims is not None:
                self._refresh_others(None, self.dra.give_back(pod_record.claims, pod_record.request.uid))
            return pod_record
        if record.unheld.pop(key, None) is None:  # else it held none here (`add_node`)
            for plugin, part in pod_record.parts.items():
                if plugin in record.states:
                    self._give_back_devices(record, plugin, key, part)
        if pod_record.claims is not None:
            self._refresh_others(record, self.dra.give_back(pod_record.claims, pod_record.request.uid))
        record.pods.pop(key, None)
        record.unhold_named(key, pod_record.parts)
        self._count_usage(record, pod_record.request, -1)
        self._refresh(record)
        return pod_record

    def _refresh_others(self, record: NodeRecord | None, touched: set[str]) -> None:
        """A pod's DRA claims were held or given back on `record`'s node: other nodes whose devices they name (a
        device shared between nodes) answer anew."""
        if "*" in touched:
            touched = set(self.nodes)
        for name in touched:
            other = self.nodes.get(name)
            if other is not None and other is not record:
                self._refresh(other)

    def update_bound(self, request: PodRequest) -> bool:
        """A bound pod's requests changed in place (Kubernetes 1.33+ resizes a running pod: its spec, then what the
        kubelet reports in its status), or its labels: count the new ones on its node, keeping the devices it
        holds, as kube-scheduler's cache `UpdatePod` does. False when the engine holds no such pod (another UID, or
        none)."""
        held = self.pods.get(request.key)
        if held is None or held.request.uid != request.uid:
            return False
        record = self.nodes.get(held.node)
        if record is None:
            return False
        self._count_usage(record, held.request, -1)
        held.request = request
        self._count_usage(record, request, +1)
        self._refresh(record)
        return True

    def _set_aside(self, key: str) -> PodRecord | None:
        """`release` for a what-if, whose `_put_back` restores exactly what the pod held: nothing else about the pod
        changes. A part's `release` may forget more (`Permitting.release`: that the pod waits at Permit), and a
        preemption that weighed the node of a gang member waiting there made it wait no more, its timeout restarted
        when it was queued again. A pod counted on a verify key stays counted while set aside: `/metrics` is read
        from another thread, and a scrape in the middle of a what-if read 0 while the pod still needed the old key."""
        held = NodeCache.release(self, key)
        if held is not None and held.by_verify_key:
            self.on_verify_keys.add(key)
        return held

    @contextmanager
    def pods_removed(self, keys: Iterable[str]) -> Iterator[list[PodRecord]]:
        """Pretend the pods are gone (preemption what-ifs), then put back exactly what they held."""
        removed = [record for key in keys if (record := self._set_aside(key)) is not None]
        try:
            yield removed
        finally:
            for record in removed:
                self._put_back(record)

    def _put_back(self, pod_record: PodRecord) -> None:
        """Put back exactly what a released pod held."""
        node = self.nodes.get(pod_record.node)
        if node is None:
            return
        status = self._hold_devices(node, pod_record.request, pod_record.parts, teaches=False)
        if not status.ok:  # counted, holding none, as a pod its changed node no longer fits (`add_node`)
            log.error("could not restore %s: %s", pod_record.request.key, status.message)
            node.unheld[pod_record.request.key] = _unheld(pod_record.request.key, status.message)
        self._enter(node, pod_record)

    def set_node_live(self, name: str, live: bool, reason: str | None = None) -> bool:
        """Whether node `name` takes new device pods: not while its node side has stopped reporting (its kubegpu
        node lease expired, `kubegpu.scheduler.liveness`); `reason` is what each device pod refused there is told.
        Pods already on the node stay, and pods that request no device resource are not affected. Returns whether
        anything changed; the node's remembered answers are then stale (its version and the generation move on)."""
        wanted = None if live else (reason or "node(s) had an expired kubegpu node lease")
        previous = self._dead.get(name)
        if previous == wanted:
            return False
        if wanted is None:
            del self._dead[name]
        else:
            self._dead[name] = wanted
        record = self.nodes.get(name)
        if record is None:
            return True
        if (previous is None) != (wanted is None):
            klass = self._klass(record.info, record.digest)
            self._join_class(name, record.klass, klass)
            record.klass = klass
            self._refresh(record)
        else:  # only the wording changed (the lease's age)
            record.version += 1
            self._changed(name)
        return True


def count_on_node(record: NodeRecord, pod: PodRequest, sign: int) -> None:
    """Add (`sign` +1) or remove (-1) the pod's cpu, memory, pods, extended resources and host ports in the node's
    usage: all the node's own filters read of its pods, so preemption's what-ifs count pods in and out of a copy of
    the node (`NodeRecord.usage_copy`) the same way."""
    used = record.used
    used["pods"] += sign
    used["cpu"] += sign * pod.cpu_milli
    used["memory"] += sign * pod.memory
    for resource, amount in pod.requests.items():
        if resource not in CPU_MEMORY:
            used[resource] += sign * amount
    for port in pod.host_ports:
        record.ports[(port.ip, port.protocol, port.port)] += sign
        if record.ports[(port.ip, port.protocol, port.port)] <= 0:
            del record.ports[(port.ip, port.protocol, port.port)]


def _unheld(key: str, problem: str) -> str:
    """Why a node's devices of a running pod's plugins are given to no one (`NodeRecord.unheld`)."""
    return (
        f"pod {key} runs on devices this node no longer lists as it did ({problem}); its devices here are given to "
        "no other pod until it leaves"
    )
