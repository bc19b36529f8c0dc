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

    def _klass(self, info: NodeInfo) -> int:
        """The node's equivalence class. Nodes alike in everything but their name give the same answer to a request
        whenever the answer does not depend on what is in use, so one unresolvable answer in a cycle settles the
        whole class (a trn1 refusing 7 devices refuses them on every trn1)."""
        key = (
            tuple(sorted((k, v) for k, v in info.labels.items() if k not in NAME_LABELS)),
            tuple(sorted(info.allocatable.items())),
            info.taints,
            info.unschedulable,
            info.ready,
            tuple(sorted((p, inv.model_dump_json()) for p, inv in info.inventories.items())),
            self.node_digest(info),  # what else of the node the plugins' states read
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
        it, and the node is then a class of its own (its name in the answer): never taken for alike by mistake."""
        digests: list[Hashable] = []
        for plugin in self._digesters:
            try:
                digests.append(self.plugins.call(plugin, NODE_DIGEST_HOOK, node=info))
            except PluginHookError as exc:
                log.error("%s", exc.on_node(info.name))
                digests.append((plugin, "failed on node", info.name))
        return tuple(digests)

    def node_change_may_help(self, previous: NodeInfo | None, info: NodeInfo) -> str | None:
        """Why a node's change may make a pod fit that fit nowhere (`filters.node_change_may_help`, and a change to
        what the plugins' states read beyond it: `node_digest`), or None."""
        why = filters.node_change_may_help(previous, info)
        if (
            why is None
            and previous is not None
            and self._digesters
            and self.node_digest(previous) != self.node_digest(info)
        ):
            return "what a plugin reads of the node"
        return why

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
