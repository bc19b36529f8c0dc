"""The objects that select a pod, for PodTopologySpread's default constraints.

kube-scheduler 1.20 (feature DefaultPodTopologySpread, on by default) gives a pod that sets no
`topologySpreadConstraints` of its own the profile's default constraints (`kubegpu.scheduler.scores.Profile`), all
with one label selector deduced from the objects in the pod's namespace that select it:

* Services and ReplicationControllers: their `spec.selector` maps, merged (they all match the pod, so no two
  disagree on a value);
* ReplicaSets and StatefulSets: every requirement of their `spec.selector` added to the merged map's.

An owner whose selector is empty selects no pod here (client-go's listers skip a nil or empty selector rather than
let it match everything, and a Service's empty map merges to nothing), and a pod without labels has no owner. When no
owner selects the pod, the pod gets no default constraints. Replicas of one workload select the same owners, so
they share one selector, and the index of placed pods (`kubegpu.scheduler.podindex`) counts them by it.

`Owners` keeps what the front-ends report (the simulator from its input files, the custom scheduler from its
informers, `kubegpu.scheduler.objects.owner` reading either): no Kubernetes client here.
"""

from __future__ import annotations

from collections.abc import Mapping

from kubegpu.core.models import LabelSelector, Requirement
from kubegpu.scheduler.filters import selector_matches

__all__ = ["OWNER_KINDS", "Owners"]

OWNER_KINDS = ("Service", "ReplicationController", "ReplicaSet", "StatefulSet")
MEMO_LIMIT = 4096  # pod label sets remembered per generation of the owners


class Owners:
    """The owners' selectors by namespace, and each pod label set's combined selector (module docstring)."""

    __slots__ = ("_by_namespace", "_memo", "epoch")

    def __init__(self) -> None:
        # namespace -> (kind, name) -> selector; an owner that selects nothing is not kept.
        self._by_namespace: dict[str, dict[tuple[str, str], LabelSelector]] = {}
        # (namespace, the pod's labels) -> the combined selector (None: no owner selects such a pod), cleared
        # whenever an owner changes.
        self._memo: dict[tuple[str, frozenset[tuple[str, str]]], LabelSelector | None] = {}
        self.epoch = 0  # bumped on every change, so that answers built from the owners can tell they are stale

    def set(self, kind: str, namespace: str, name: str, selector: LabelSelector | None) -> bool:
        """An owner added or changed (`selector`: its `spec.selector`; None or empty: it selects no pod), or deleted
        (None). Returns whether anything changed."""
        if kind not in OWNER_KINDS:
            raise ValueError(f"kind must be one of {', '.join(OWNER_KINDS)}, not {kind!r}")
        owners = self._by_namespace.get(namespace)
        known = owners.get((kind, name)) if owners is not None else None
        if selector is not None and not selector.requirements:
            selector = None
        if known == selector:
            return False
        if selector is None:
            assert owners is not None
            del owners[(kind, name)]
            if not owners:
                del self._by_namespace[namespace]
        else:
            self._by_namespace.setdefault(namespace, {})[(kind, name)] = selector
        self.epoch += 1
        self._memo.clear()
        return True

    def forget_memos(self) -> None:
        """Drop the remembered combined selectors (the engine's `forget_memos`)."""
        self._memo.clear()

    def keys(self) -> list[tuple[str, str, str]]:
        """(kind, namespace, name) of every owner kept."""
        return [(kind, namespace, name) for namespace, owners in self._by_namespace.items() for kind, name in owners]

    def __bool__(self) -> bool:
        return bool(self._by_namespace)

    def selector_for(self, namespace: str, labels: Mapping[str, str]) -> LabelSelector | None:
        """The combined selector of the owners that select a pod with these labels in `namespace`; None when none
        does (the pod then gets no default constraints)."""
        owners = self._by_namespace.get(namespace)
        if owners is None or not labels:
            return None
        slot = (namespace, frozenset(labels.items()))
        if slot in self._memo:
            return self._memo[slot]
        found: dict[Requirement, None] = {}
        for selector in owners.values():
            # A map's entries are `key In (value)` requirements (`objects.owner`), so merging maps and adding
            # requirements are one operation; a requirement two owners share is kept once.
            if selector_matches(selector, labels):
                found.update(dict.fromkeys(selector.requirements))
        combined = LabelSelector(tuple(sorted(found, key=_order))) if found else None
        if len(self._memo) >= MEMO_LIMIT:
            self._memo.clear()
        self._memo[slot] = combined
        return combined


def _order(requirement: Requirement) -> tuple[str, str, tuple[str, ...]]:
    return requirement.key, requirement.operator, requirement.values
