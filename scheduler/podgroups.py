"""Pod groups (gangs) and topology levels, in the shapes users already write. A pure model: no Kubernetes client.

A gang is a set of pods that is useless until at least `min_member` of them run. Two ways to say so are read:

* scheduler-plugins' coscheduling: a `PodGroup` object (`scheduling.x-k8s.io/v1alpha1`; `spec.minMember`,
  `spec.scheduleTimeoutSeconds`, `spec.minResources`), its members labelled `scheduling.x-k8s.io/pod-group: NAME` in
  the same namespace (Kubeflow's training operator writes exactly this);
* Kueue's plain pod groups: the label `kueue.x-k8s.io/pod-group-name: NAME` and the annotation
  `kueue.x-k8s.io/pod-group-total-count: N` on every member (all N must have places).

Topology: a profile names node labels from the widest level to the narrowest, as Kueue's `Topology` object does
(`spec.levels[].nodeLabel`); `kubernetes.io/hostname` is always the narrowest. With no profile, AWS's network topology
labels (`topology.k8s.aws/network-node-layer-1` the widest, down to `-4`) and NVIDIA's NVLink domain
(`nvidia.com/gpu.clique`) are the levels wherever nodes carry them. A gang asks for a level with Kueue's annotations
on its members or its PodGroup: `kueue.x-k8s.io/podset-required-topology: LABEL` (every member in one domain of that
level, or none placed) or `kueue.x-k8s.io/podset-preferred-topology: LABEL` (as few domains as possible).

Members are placed rank by rank (`member_index`): Kueue's `kueue.x-k8s.io/pod-group-pod-index` label (or the label
its `kueue.x-k8s.io/pod-group-pod-index-label` annotation names), else the Job's
`batch.kubernetes.io/job-completion-index`, else a StatefulSet's `apps.kubernetes.io/pod-index`.

Everything read here is someone else's text: each reader raises `ManifestError` naming the field, sizes are bounded
(`MAX_MEMBERS`, `MAX_TIMEOUT_SECONDS`, `MAX_LEVELS`), and names are checked as Kubernetes checks them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kubegpu.core.errors import shorten
from kubegpu.core.manifests import ManifestError
from kubegpu.core.models import PodRequest
from kubegpu.core.quantity import QuantityError, parse_quantity

__all__ = [
    "AWS_LAYERS",
    "CLIQUE",
    "HOSTNAME",
    "KNOWN_LEVELS",
    "PodGroup",
    "gang_key",
    "kueue_group",
    "member_index",
    "pod_group",
    "topology_levels",
]

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
POD_GROUP_API = "scheduling.x-k8s.io/"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_INDEX = "kueue.x-k8s.io/pod-group-pod-index"
KUEUE_INDEX_LABEL = "kueue.x-k8s.io/pod-group-pod-index-label"
INDEX_LABELS = ("batch.kubernetes.io/job-completion-index", "apps.kubernetes.io/pod-index")
HOSTNAME = "kubernetes.io/hostname"
CLIQUE = "nvidia.com/gpu.clique"
AWS_LAYERS = tuple(f"topology.k8s.aws/network-node-layer-{n}" for n in range(1, 5))
KNOWN_LEVELS = (*AWS_LAYERS, CLIQUE)  # widest first; levels with no configuration

MAX_MEMBERS = 10_000
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600
DEFAULT_TIMEOUT_SECONDS = 60  # scheduler-plugins' default permit waiting time
MAX_LEVELS = 16
MAX_INDEX = 1 << 31

_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # DNS-1123 subdomain, at most 253 characters
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")  # at most 63 characters
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DIGITS = re.compile(r"[0-9]{1,10}")

Source = Literal["PodGroup", "kueue"]


@dataclass(frozen=True, slots=True)
class PodGroup:
    """A gang: `min_member` pods of `namespace` that must all have places before any is bound; `timeout_seconds` a
    member waits for the others (then whatever it holds goes back); `min_resources` the sum they need at least
    (scheduler-plugins' quick no); `required` / `preferred` the topology level (a node label) asked for."""

    namespace: str
    name: str
    min_member: int
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    min_resources: Mapping[str, int] = field(default_factory=dict)
    required: str | None = None
    preferred: str | None = None
    source: Source = "PodGroup"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _bounded_int(value: object, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(f"{where}: expected an integer, got {shorten(repr(value))}")
    if not low <= value <= high:
        raise ManifestError(f"{where}: {value} is out of range ({low} to {high})")
    return value


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or len(value) > 253 or not _NAME.fullmatch(value):
        raise ManifestError(
            f"{where}: {shorten(repr(value))} is not a valid name (lower-case letters, digits, '-' and '.', "
            "at most 253 characters)"
        )
    return value


def _label_key(value: object, where: str) -> str:
    """A label key (`prefix/name`): the topology level a gang asks for, or a profile's level."""
    if not isinstance(value, str) or not value or len(value) > 317:
        raise ManifestError(f"{where}: {shorten(repr(value))} is not a node label key")
    prefix, _, name = value.rpartition("/")
    if (
        (prefix and (len(prefix) > 253 or not _NAME.fullmatch(prefix)))
        or len(name) > 63
        or not _LABEL_NAME.fullmatch(name)
    ):
        raise ManifestError(f"{where}: {shorten(repr(value))} is not a node label key")
    return value


def _topology(annotations: Mapping[str, str], where: str) -> tuple[str | None, str | None]:
    required = annotations.get(REQUIRED_TOPOLOGY)
    preferred = annotations.get(PREFERRED_TOPOLOGY)
    if required is not None:
        _label_key(required, f"{where}.annotations[{REQUIRED_TOPOLOGY}]")
    if preferred is not None:
        _label_key(preferred, f"{where}.annotations[{PREFERRED_TOPOLOGY}]")
    if required is not None and preferred is not None:
        raise ManifestError(
            f"{where}.annotations: {REQUIRED_TOPOLOGY} and {PREFERRED_TOPOLOGY} both set; ask for one of them"
        )
    return required, preferred


def pod_group(document: Mapping[str, Any]) -> PodGroup:
    """A scheduler-plugins `PodGroup` document (`scheduling.x-k8s.io/v1alpha1`), its topology annotations included.
    Raises `ManifestError` naming the field."""
    api = document.get("apiVersion")
    if not isinstance(api, str) or not api.startswith(POD_GROUP_API):
        raise ManifestError(f"PodGroup.apiVersion: expected scheduling.x-k8s.io/v1alpha1, got {shorten(repr(api))}")
    meta = document.get("metadata")
    if not isinstance(meta, Mapping):
        raise ManifestError("PodGroup.metadata: expected a mapping")
    name = _name(meta.get("name"), "PodGroup.metadata.name")
    namespace = _name(meta.get("namespace", "default"), "PodGroup.metadata.namespace")
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping) or not all(isinstance(v, str) for v in annotations.values()):
        raise ManifestError("PodGroup.metadata.annotations: expected a mapping of strings")
    spec = document.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ManifestError("PodGroup.spec: expected a mapping")
    min_member = _bounded_int(spec.get("minMember", 1), "PodGroup.spec.minMember", 1, MAX_MEMBERS)
    timeout = spec.get("scheduleTimeoutSeconds")
    timeout = (
        DEFAULT_TIMEOUT_SECONDS
        if timeout is None
        else _bounded_int(timeout, "PodGroup.spec.scheduleTimeoutSeconds", 1, MAX_TIMEOUT_SECONDS)
    )
    resources = spec.get("minResources") or {}
    if not isinstance(resources, Mapping) or len(resources) > 64:
        raise ManifestError("PodGroup.spec.minResources: expected a mapping of at most 64 resources")
    min_resources: dict[str, int] = {}
    for resource, value in resources.items():
        where = f"PodGroup.spec.minResources[{shorten(str(resource))}]"
        try:
            amount = parse_quantity(value)
        except QuantityError as exc:
            raise ManifestError(f"{where}: {exc}") from None
        if amount < 0:
            raise ManifestError(f"{where}: {shorten(repr(value))} is negative")
        scaled = amount * 1000 if resource == "cpu" else amount
        min_resources[str(resource)] = int(scaled) + (int(scaled) != scaled)
    required, preferred = _topology(annotations, "PodGroup.metadata")
    return PodGroup(namespace, name, min_member, timeout, min_resources, required, preferred, "PodGroup")


def gang_key(pod: PodRequest) -> str | None:
    """`namespace/name` of the gang the pod says it belongs to (coscheduling's label first, then Kueue's); None."""
    labels = pod.labels
    name = labels.get(POD_GROUP_LABEL) or labels.get(KUEUE_GROUP_LABEL)
    return None if not name else f"{pod.namespace}/{name}"


def kueue_group(pod: PodRequest) -> PodGroup | None:
    """The gang a Kueue pod-group member describes by itself (its label, total count and topology annotations),
    None when the pod has no Kueue group label. Raises `ManifestError` naming the field."""
    name = pod.labels.get(KUEUE_GROUP_LABEL)
    if not name:
        return None
    where = f"pod {shorten(pod.key)}: metadata"
    if len(name) > 63 or not _LABEL_VALUE.fullmatch(name):
        raise ManifestError(f"{where}.labels[{KUEUE_GROUP_LABEL}]: {shorten(repr(name))} is not a label value")
    total = pod.annotations.get(KUEUE_TOTAL)
    if total is None:
        raise ManifestError(f"{where}.annotations[{KUEUE_TOTAL}]: required with {KUEUE_GROUP_LABEL}")
    if not _DIGITS.fullmatch(total):
        raise ManifestError(f"{where}.annotations[{KUEUE_TOTAL}]: {shorten(repr(total))} is not a whole number")
    count = _bounded_int(int(total), f"{where}.annotations[{KUEUE_TOTAL}]", 1, MAX_MEMBERS)
    required, preferred = _topology(pod.annotations, where)
    return PodGroup(pod.namespace, name, count, DEFAULT_TIMEOUT_SECONDS, {}, required, preferred, "kueue")


def member_topology(pod: PodRequest) -> tuple[str | None, str | None]:
    """The (required, preferred) topology level a member's own annotations ask for. Raises `ManifestError`."""
    return _topology(pod.annotations, f"pod {shorten(pod.key)}: metadata")


def member_index(pod: PodRequest) -> int | None:
    """The member's rank in its gang (None: none given; such members go after the ranked ones, by name)."""
    labels = pod.labels
    named = pod.annotations.get(KUEUE_INDEX_LABEL)
    for key in (KUEUE_INDEX, *((named,) if named else ()), *INDEX_LABELS):
        value = labels.get(key)
        if value is None and key in INDEX_LABELS:
            value = pod.annotations.get(key)  # a Job writes the completion index as an annotation too
        if value is not None and _DIGITS.fullmatch(value) and int(value) < MAX_INDEX:
            return int(value)
    return None


def topology_levels(document: Mapping[str, Any]) -> tuple[str, ...]:
    """A Kueue `Topology` document's levels (`spec.levels[].nodeLabel`), widest first. Raises `ManifestError`."""
    spec = document.get("spec")
    levels = spec.get("levels") if isinstance(spec, Mapping) else None
    if not isinstance(levels, list) or not levels or len(levels) > MAX_LEVELS:
        raise ManifestError(f"Topology.spec.levels: expected a list of 1 to {MAX_LEVELS} levels")
    found: list[str] = []
    for number, level in enumerate(levels):
        where = f"Topology.spec.levels[{number}].nodeLabel"
        label = _label_key(level.get("nodeLabel") if isinstance(level, Mapping) else None, where)
        if label in found:
            raise ManifestError(f"{where}: {shorten(label)} is named twice")
        found.append(label)
    return tuple(found)


def profile_levels(levels: Iterable[str] | None, node_labels: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
    """The levels a cluster uses, widest first, without the hostname: the profile's, or with none the known labels
    (`KNOWN_LEVELS`) that some node carries."""
    if levels is not None:
        return tuple(level for level in levels if level != HOSTNAME)
    present: set[str] = set()
    for labels in node_labels:
        present.update(level for level in KNOWN_LEVELS if level in labels)
        if len(present) == len(KNOWN_LEVELS):
            break
    return tuple(level for level in KNOWN_LEVELS if level in present)
