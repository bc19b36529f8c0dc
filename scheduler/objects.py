"""The cluster objects besides Nodes and Pods that scheduling reads, as the engine wants them.

PodDisruptionBudgets (policy/v1beta1) for preemption, PersistentVolumeClaims and PersistentVolumes for volume binding,
PriorityClasses for pods that name one, Namespaces for their labels (where DRA claims may ask for admin access), and
the Services, ReplicationControllers, ReplicaSets and StatefulSets whose
selectors give a pod its default spread constraints (`kubegpu.scheduler.owners`). The simulator reads them from its
input files, the custom scheduler from its informers; both hand the engine the same records. Each reader raises
`ManifestError` naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubegpu.core.errors import shorten
from kubegpu.core.manifests import ManifestError, label_selector, node_selector_terms
from kubegpu.core.models import LabelSelector, NodeSelectorTerm, PodRequest, Requirement
from kubegpu.scheduler.owners import OWNER_KINDS
from kubegpu.scheduler.preemption import Budget

__all__ = [
    "PriorityClass",
    "budget",
    "claim",
    "disruptions_allowed",
    "namespace",
    "owner",
    "priority_class",
    "volume",
]

# The owners whose `spec.selector` is a plain map of labels (the others have a `metav1.LabelSelector`).
MAP_SELECTORS = frozenset({"Service", "ReplicationController"})


def _meta(document: Mapping[str, Any], kind: str) -> tuple[str, str]:
    meta = document.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise ManifestError(f"{kind}.metadata.name: a name is required")
    namespace = meta.get("namespace", "default")
    if not isinstance(namespace, str):
        raise ManifestError(f"{kind}.metadata.namespace: expected a string")
    return namespace, meta["name"]


def _section(document: Mapping[str, Any], key: str, kind: str) -> Mapping[str, Any]:
    value = document.get(key) or {}
    if not isinstance(value, Mapping):
        raise ManifestError(f"{kind}.{key}: expected an object")
    return value


def budget(document: Mapping[str, Any], placed: Iterable[PodRequest] | None = None) -> Budget:
    """A PodDisruptionBudget. `status.disruptionsAllowed` when the disruption controller wrote it; else, given the
    `placed` pods (the simulator, which runs no controller), what the controller would compute from the spec."""
    kind = "PodDisruptionBudget"
    namespace, name = _meta(document, kind)
    spec, status = _section(document, "spec", kind), _section(document, "status", kind)
    selector = label_selector(spec.get("selector"), f"{kind}.spec.selector")
    disrupted = status.get("disruptedPods") or {}
    allowed = status.get("disruptionsAllowed")
    found = Budget(
        namespace, name, selector, 0, frozenset(disrupted) if isinstance(disrupted, Mapping) else frozenset()
    )
    if isinstance(allowed, int) and not isinstance(allowed, bool):
        return Budget(namespace, name, selector, allowed, found.disrupted)
    if placed is None:
        disruptions_allowed(spec, 0, kind)  # read now: a file's budget is refused where it is read, not mid-run
        return found
    healthy = sum(1 for pod in placed if found.selects(pod))
    return Budget(namespace, name, selector, disruptions_allowed(spec, healthy, kind), found.disrupted)


def disruptions_allowed(spec: Mapping[str, Any], healthy: int, kind: str = "PodDisruptionBudget") -> int:
    """The disruption controller's arithmetic for `healthy` selected pods, all of them expected."""

    def amount(value: Any, field: str, round_up: bool) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.endswith("%") and value[:-1].isascii() and value[:-1].isdigit():
            digits = value[:-1].lstrip("0")  # the API server's ^[0-9]+%$, read as Go's Atoi reads it
            if len(digits) > 3 or int(digits or "0") > 100:  # refused by the API server too
                raise ManifestError(f"{kind}.spec.{field}: a percentage over 100 ({shorten(value)!r})")
            share = int(digits or "0") * healthy  # hundredths of a pod, rounded as the controller rounds
            return -(-share // 100) if round_up else share // 100
        raise ManifestError(f"{kind}.spec.{field}: {shorten(str(value))!r} is neither a count nor a percentage")

    if spec.get("maxUnavailable") is not None:
        return max(0, amount(spec["maxUnavailable"], "maxUnavailable", round_up=True))
    if spec.get("minAvailable") is not None:
        return max(0, healthy - amount(spec["minAvailable"], "minAvailable", round_up=True))
    return 0


def claim(document: Mapping[str, Any]) -> tuple[str, str, str, bool]:
    """A PersistentVolumeClaim: (namespace, name, the bound volume's name or "" while unbound, whether it is being
    deleted: it has a deletionTimestamp)."""
    kind = "PersistentVolumeClaim"
    namespace, name = _meta(document, kind)
    spec, status = _section(document, "spec", kind), _section(document, "status", kind)
    bound = spec.get("volumeName") or ""
    if status.get("phase") not in (None, "Bound"):
        bound = ""
    if not isinstance(bound, str):
        raise ManifestError(f"{kind}.spec.volumeName: expected a string")
    deleting = bool((document.get("metadata") or {}).get("deletionTimestamp"))
    return namespace, name, bound, deleting


def volume(document: Mapping[str, Any]) -> tuple[str, tuple[NodeSelectorTerm, ...] | None]:
    """A PersistentVolume: its name and the terms of `spec.nodeAffinity.required` (None: any node)."""
    kind = "PersistentVolume"
    _, name = _meta(document, kind)
    spec = _section(document, "spec", kind)
    affinity = spec.get("nodeAffinity") or {}
    if not isinstance(affinity, Mapping):
        raise ManifestError(f"{kind}.spec.nodeAffinity: expected an object")
    return name, node_selector_terms(affinity.get("required"), f"{kind}.spec.nodeAffinity.required")


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    global_default: bool = False
    preemption_policy: str = "PreemptLowerPriority"


def namespace(document: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """A Namespace: (name, its labels), for `Engine.set_namespace`."""
    kind = "Namespace"
    _, name = _meta(document, kind)
    labels = _section(document, "metadata", kind).get("labels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise ManifestError(f"{kind}.metadata.labels: expected a map of strings")
    return name, {str(k): v for k, v in labels.items()}


def priority_class(document: Mapping[str, Any]) -> PriorityClass:
    kind = "PriorityClass"
    _, name = _meta(document, kind)
    value = document.get("value")
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**31) <= value <= 10**9:
        raise ManifestError(f"{kind}.value: expected an integer up to 1000000000")
    policy = document.get("preemptionPolicy") or "PreemptLowerPriority"
    if policy not in ("PreemptLowerPriority", "Never"):
        raise ManifestError(f"{kind}.preemptionPolicy: expected PreemptLowerPriority or Never")
    return PriorityClass(name, value, bool(document.get("globalDefault")), policy)


def owner(kind: str, document: Mapping[str, Any]) -> tuple[str, str, str, LabelSelector | None]:
    """A Service, ReplicationController, ReplicaSet or StatefulSet of `kind` (a watch's items carry no kind):
    (kind, namespace, name, its `spec.selector`; None when it has none), for `Engine.set_owner`."""
    if kind not in OWNER_KINDS:
        raise ManifestError(f"kind: expected one of {', '.join(OWNER_KINDS)}, got {shorten(str(kind))!r}")
    namespace, name = _meta(document, kind)
    raw = _section(document, "spec", kind).get("selector")
    where = f"{kind}.spec.selector"
    if kind not in MAP_SELECTORS:
        return kind, namespace, name, label_selector(raw, where)
    if raw is not None and not isinstance(raw, Mapping):
        raise ManifestError(f"{where}: expected a map of labels")
    for key, value in (raw or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ManifestError(f"{where}.{shorten(str(key))}: expected a string label value")
    requirements = tuple(Requirement(key, "In", (value,)) for key, value in sorted((raw or {}).items()))
    return kind, namespace, name, LabelSelector(requirements) if requirements else None
