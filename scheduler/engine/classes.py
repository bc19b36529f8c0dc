"""Node classes: nodes alike in everything a node's own filters and its plugins' states read but the name (labels
but the hostname, allocatable, taints, schedulability, readiness, advertised inventories, and what a plugin says its
state reads besides: `kubegpu_scheduler_node_digest`) are one class. One answer to a pod that does not depend on
what is in use settles the whole class in a cycle (a trn1 refusing 7 devices refuses them on every trn1), and a
node's change wakes the pods that fit nowhere only when it changes one of those (`node_change_may_help`)."""

from __future__ import annotations

from collections.abc import Hashable

from kubegpu.core.models import NodeInfo
from kubegpu.core.plugin_manager import PluginHookError
from kubegpu.scheduler import filters
from kubegpu.scheduler.engine.ledger import Ledger
from kubegpu.scheduler.engine.records import NAME_LABELS, NODE_DIGEST_HOOK, log


class NodeClasses(Ledger):
    """Each node's class number, and the members of each class."""

    # The node a Node update replaced last and its digest (`NodeCache.add_node`), for `node_change_may_help` next.
    _replaced: tuple[NodeInfo, tuple[Hashable, ...]] | None = None

    def _klass(self, info: NodeInfo, digest: tuple[Hashable, ...]) -> int:
        """The node's equivalence class. Nodes alike in everything but their name give the same answer to a request
        whenever the answer does not depend on what is in use, so one unresolvable answer in a cycle settles the
        whole class (a trn1 refusing 7 devices refuses them on every trn1). `digest`: `node_digest` when the node's
        states were built (kept in `NodeRecord.digest`), not asked again: what the states read."""
        key = (
            tuple(sorted((k, v) for k, v in info.labels.items() if k not in NAME_LABELS)),
            tuple(sorted(info.allocatable.items())),
            info.taints,
            info.unschedulable,
            info.ready,
            tuple(sorted((p, inv.model_dump_json()) for p, inv in info.inventories.items())),
            digest,  # what else of the node the plugins' states read
            info.name if info.name in self._dead else None,  # a node that is not live answers unlike its class
        )
        number = self._classes.get(key)
        if number is None:
            number = self._classes[key] = self._class_serial
            self._class_keys[number] = key
            self._class_serial += 1
        return number

    def node_digest(self, info: NodeInfo) -> tuple[Hashable, ...]:
        """What of the node, beyond its labels, allocatable and inventories, the plugins' states read: each plugin's
        `kubegpu_scheduler_node_digest` that has one, in the plugins' order. A plugin that fails it is logged, naming
        it, and the node is then a class of its own (its name in the answer): never taken for alike by mistake. A
        failure is logged once until the plugin answers for the node again (asked at each update and recheck)."""
        digests: list[Hashable] = []
        for plugin in self._digesters:
            try:
                digests.append(self.plugins.call(plugin, NODE_DIGEST_HOOK, node=info))
                self._digest_failing.discard((plugin, info.name))
            except PluginHookError as exc:
                if (plugin, info.name) in self._digest_failing:
                    log.debug("%s", exc.on_node(info.name))
                else:
                    self._digest_failing.add((plugin, info.name))
                    log.error("%s (logged once until it answers for the node)", exc.on_node(info.name))
                digests.append((plugin, "failed on node", info.name))
        return tuple(digests)

    def node_change_may_help(self, previous: NodeInfo | None, info: NodeInfo) -> str | None:
        """Why a node's change may make a pod fit that fit nowhere (`filters.node_change_may_help`, and a change to
        what the plugins' states read beyond it: `node_digest`), or None. A node the engine holds is compared by the
        digest its states were built with (`NodeRecord.digest`; the one it replaced, `_replaced`), not asked again:
        a digest that failed or was slow cost that once per update, not three times."""
        why = filters.node_change_may_help(previous, info)
        if (
            why is None
            and previous is not None
            and self._digesters
            and self._digest_of(previous) != self._digest_of(info)
        ):
            return "what a plugin reads of the node"
        return why

    def _digest_of(self, info: NodeInfo) -> tuple[Hashable, ...]:
        record = self.nodes.get(info.name)
        if record is not None and (record.info is info or record.info == info):
            return record.digest
        if self._replaced is not None and self._replaced[0] is info:
            return self._replaced[1]
        return self.node_digest(info)

    def _join_class(self, name: str, old: int | None, new: int | None) -> None:
        if old is not None and old != new:
            members = self._class_nodes.get(old)
            if members is not None:
                members.pop(name, None)
                if not members:
                    del self._class_nodes[old]
                    del self._classes[self._class_keys.pop(old)]
        if new is not None:
            self._class_nodes.setdefault(new, {})[name] = None
