"""The data model every part of kubegpu shares.

Three kinds of record cross the boundaries between the scheduler, the plugins and the node side:

* what a node *has*: `DeviceInventory` per plugin (devices with their attributes, health and the topology the plugin
  needs), published by the advertiser in the node annotation `kubegpu.io/devices` (`NodeDevices`), and the
  scheduler's view of a node, `NodeInfo` (labels, allocatable, taints, the advertised inventories);
* what a pod *asks for*: `PodRequest`, one `ContainerRequest` per container with the resources it requests in
  integer units (extended resources from `resources.limits`, falling back to `resources.requests`), plus the pod
  annotations that refine a request (a GPU model, a minimum GPU memory);
* what the pod *got*: `PluginAllocation`, one plugin's concrete device ids per container and resource, with per-device
  amounts where devices are shared; the engine merges these into the `kubegpu.io/allocation` annotation
  (`kubegpu.core.annotations`).

Boundary records are pydantic models (their validation errors name the field); the records the engine touches per
pod and per node are frozen dataclasses built once from validated input.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "Advertisement",
    "ClaimRef",
    "ContainerAllocation",
    "ContainerEdit",
    "ContainerRequest",
    "DeviceCell",
    "DeviceInfo",
    "DeviceInventory",
    "DeviceNode",
    "DeviceOwnership",
    "HostPort",
    "InitStep",
    "LabelSelector",
    "Mount",
    "NodeDevices",
    "NodeInfo",
    "NodeSelectorTerm",
    "Occupancy",
    "OwnerReference",
    "PluginAllocation",
    "PodAffinityTerm",
    "PodRequest",
    "Requirement",
    "Scalar",
    "SpreadConstraint",
    "Taint",
    "Toleration",
    "share_slot",
    "slot_id",
]

Scalar = str | int | float | bool
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


# ---------------------------------------------------------------------------------------------------------------
# What a node has
# ---------------------------------------------------------------------------------------------------------------


# A device several containers share, as a Kubernetes device plugin lists it: one id per share slot (HAMi's accounting:
# a GPU split 10 ways is ten ids), so that the kubelet admits as many share pods per device as the scheduler places.
# `slot_id("0", 3)` is "0::3"; the device plugin's Allocate turns the kubelet's slot ids back into the devices the
# scheduler's allocation names (`share_slot`). No device id of any plugin contains the separator.
SLOT_SEPARATOR = "::"
MAX_SLOTS = 1000


def slot_id(device: str, slot: int) -> str:
    """The device plugin id of share slot `slot` (0-based) of `device`."""
    return f"{device}{SLOT_SEPARATOR}{slot}"


def share_slot(device_plugin_id: str) -> tuple[str, int] | None:
    """(device, slot) of a share slot id (`slot_id`), None for any other id (a device id itself, or a malformed one:
    a slot that is not a number from 0 to `MAX_SLOTS` - 1, or no device before the separator)."""
    device, separator, slot = device_plugin_id.rpartition(SLOT_SEPARATOR)
    if not separator or not device or not (slot.isascii() and slot.isdigit() and len(slot) <= 4):
        return None
    number = int(slot)
    return (device, number) if number < MAX_SLOTS else None


class DeviceInfo(BaseModel):
    """One device as its plugin sees it. `id` is the string the allocation annotation uses for it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    model: str | None = None
    memory: int | None = Field(default=None, ge=0, description="bytes")
    cores: int | None = Field(default=None, ge=0)
    healthy: bool = True
    attributes: dict[str, Scalar] = Field(default_factory=dict)


class DeviceInventory(BaseModel):
    """The devices one plugin found on one node, and the topology that links them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plugin: str = Field(min_length=1)
    devices: list[DeviceInfo] = Field(default_factory=list)
    topology: dict[str, Any] = Field(default_factory=dict)
    attributes: dict[str, Scalar] = Field(default_factory=dict)

    @field_validator("devices")
    @classmethod
    def _unique_ids(cls, devices: list[DeviceInfo]) -> list[DeviceInfo]:
        seen: set[str] = set()
        for device in devices:
            if device.id in seen:
                raise ValueError(f"device id {device.id!r} appears twice")
            seen.add(device.id)
        return devices

    def healthy_ids(self) -> list[str]:
        return [d.id for d in self.devices if d.healthy]


class NodeDevices(BaseModel):
    """The value of the node annotation `kubegpu.io/devices`: every plugin's inventory, keyed by plugin name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    inventories: dict[str, DeviceInventory] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str | None
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str | None = None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' matching rule: an empty key with `Exists` tolerates everything; an empty effect any effect.
        `Lt` and `Gt` (1.35+, alpha: the TaintTolerationComparisonOperators gate, without which the API server refuses
        them) compare the taint's value with the toleration's as integers: `Lt` tolerates a taint whose value is
        below the toleration's (`sla Lt 950` tolerates `sla=900`); either value not a canonical int64 tolerates
        nothing, as kube-scheduler's `compareNumericValues` answers."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key is None or self.key == "":
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        if self.operator in ("Lt", "Gt"):
            ours, theirs = _decimal_int64(self.value), _decimal_int64(taint.value)
            if ours is None or theirs is None:
                return False
            return theirs < ours if self.operator == "Lt" else theirs > ours
        return (self.value or "") == (taint.value or "")


_DECIMAL_INTEGER = re.compile(r"0|-?[1-9][0-9]{0,18}")  # upstream's IsDecimalInteger: no sign '+', no leading zeros


def _decimal_int64(text: str | None) -> int | None:
    """A taint's or toleration's value as kube-scheduler reads it for `Lt`/`Gt`: a canonical decimal int64, else
    None (which tolerates nothing)."""
    if text is None or not _DECIMAL_INTEGER.fullmatch(text):
        return None
    value = int(text)
    return value if -(1 << 63) <= value < 1 << 63 else None


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """The scheduler's view of one Node, built once from its manifest (`kubegpu.core.manifests.node_info`).

    `allocatable` holds integers: `cpu` in millicores, every other resource in its base unit (bytes, devices).
    `inventories` are the advertised `kubegpu.io/devices` inventories, keyed by plugin name (empty when the node
    has no advertiser; plugins then fall back to labels and allocatable). `images` are the container images the
    kubelet reports in `status.images`: each name of each image with the image's size in bytes, bounded by
    `kubegpu.core.limits.MAX_NODE_IMAGE_NAMES` (kube-scheduler's ImageLocality score reads them).
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, int] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    inventories: Mapping[str, DeviceInventory] = field(default_factory=dict)
    images: Mapping[str, int] = field(default_factory=dict)

    @property
    def instance_type(self) -> str | None:
        """The node's instance type from `node.kubernetes.io/instance-type` (or the deprecated
        `beta.kubernetes.io/instance-type`), trimmed; None when neither label is set."""
        for label in INSTANCE_TYPE_LABELS:
            value = self.labels.get(label, "").strip()
            if value:
                return value
        return None


# ---------------------------------------------------------------------------------------------------------------
# What a pod asks for
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container's requests: `cpu` in millicores, `memory` in bytes, extended resources as counts. `init`: a
    classic init container that holds the devices the pod needs for it beyond what the app containers and sidecars
    hold (`resources` names only those; its cpu and memory count in `PodRequest.requests` alone)."""

    name: str
    resources: Mapping[str, int] = field(default_factory=dict)
    init: bool = False


@dataclass(frozen=True, slots=True)
class InitStep:
    """A classic init container that asks for devices: its counts of each device (extended resource), and the
    sidecars started before it, which keep their devices while it runs. The kubelet gives it devices the init
    containers before it had first, then others of its pod's (`kubegpu.core.annotations.init_devices`)."""

    name: str
    resources: Mapping[str, int]
    sidecars: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Requirement:
    """One selector requirement: `key operator values`, with Kubernetes' operators (`In`, `NotIn`, `Exists`,
    `DoesNotExist`; `Gt` and `Lt` in node selectors). A label selector's `matchLabels` entry is `key In (value)`."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A pod label selector (`metav1.LabelSelector`): every requirement must hold; no requirement selects all."""

    requirements: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """One term of a required node affinity: label expressions and `metadata.name` field expressions, ANDed."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """A pod (anti-)affinity term. `selector` None selects no pod. It selects pods in `namespaces` and in the
    namespaces whose labels `namespace_selector` matches (1.22+, GA 1.24; one without requirements matches every
    namespace, None none): the owning pod's namespace alone when the manifest lists neither. A namespace's labels are
    what the cluster's Namespace object says (`kubegpu.scheduler.podindex.PodIndex.namespace_labels`)."""

    selector: LabelSelector | None
    namespaces: frozenset[str]
    topology_key: str
    namespace_selector: LabelSelector | None = None


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """A topology spread constraint; `selector` None selects no pod (its `matchLabelKeys` are already merged in).

    `min_domains` (1.30 GA): with fewer eligible domains than this, the global minimum counts as 0.
    `node_affinity_policy` / `node_taints_policy` (1.33 GA): `Honor` or `Ignore`, whether a node the pod's node
    affinity refuses / whose untolerated NoSchedule or NoExecute taint refuses it counts toward the spread."""

    max_skew: int
    topology_key: str
    when_unsatisfiable: str
    selector: LabelSelector | None
    min_domains: int = 1
    node_affinity_policy: str = "Honor"
    node_taints_policy: str = "Ignore"

    @property
    def inclusion(self) -> tuple[bool, bool]:
        """(honour the pod's node affinity, honour the node's taints) when deciding which nodes count."""
        return self.node_affinity_policy == "Honor", self.node_taints_policy == "Honor"


@dataclass(frozen=True, slots=True)
class HostPort:
    """A container port bound on the node: protocol `TCP`/`UDP`/`SCTP`, host IP `0.0.0.0` for every address."""

    port: int
    protocol: str = "TCP"
    ip: str = "0.0.0.0"


@dataclass(frozen=True, slots=True)
class OwnerReference:
    """One of a pod's `metadata.ownerReferences`: the object that owns it (`controller`: the one that manages it)."""

    kind: str
    name: str
    uid: str
    controller: bool = False


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """One of a pod's `spec.resourceClaims`: exactly one of `claim_name` and `template_name`; `generated` is the
    claim made from the template (`status.resourceClaimStatuses`), when one was."""

    name: str
    claim_name: str | None = None
    template_name: str | None = None
    generated: str | None = None


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What a pod asks of the scheduler, built once from its manifest (`kubegpu.core.manifests.pod_request`).

    `containers` are the containers that hold devices: `spec.containers`, then the sidecars (init containers with
    `restartPolicy: Always`), then, for a device a classic init container asks more of than the app containers and
    sidecars hold, the init container whose step needs the most, holding the difference (`ContainerRequest.init`:
    the kubelet keeps an init container's devices for its pod, so the allocation must name them). `init_steps` are
    the classic init containers that ask devices, in order: the allocation names what each is given of its pod's
    devices. `requests` is the pod's request of every resource as
    kube-scheduler 1.29+ computes it for fitting (`resource.PodRequests`: the containers' and sidecars' sum, at least
    any classic init container's with the sidecars started before it, plus `spec.overhead`); `cpu_milli` and `memory`
    are its cpu and memory entries. `node_affinity` is the required node affinity's terms (ORed; None when the pod
    has none).
    `priority` is `spec.priority` (the API server resolves `priorityClassName` into it). The `preferred_*` fields are
    the `preferredDuringSchedulingIgnoredDuringExecution` terms with their weights (1-100), which only scores read.
    `owner_references` are `metadata.ownerReferences`; `images` the images of `spec.containers`, in order (init
    containers' are not scored). `scheduling_gates` are the names of `spec.schedulingGates` (1.26+): while any
    remains, the pod is not to be scheduled (`kubegpu.scheduler.gates`). `resource_claims` are
    `spec.resourceClaims` (DRA, 1.34+), each naming a ResourceClaim or a ResourceClaimTemplate (`kubegpu.core.dra`).
    """

    namespace: str
    name: str
    uid: str
    containers: tuple[ContainerRequest, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    scheduler_name: str = "default-scheduler"
    node_name: str | None = None
    cpu_milli: int = 0
    memory: int = 0
    phase: str | None = None
    requests: Mapping[str, int] = field(default_factory=dict)
    node_affinity: tuple[NodeSelectorTerm, ...] | None = None
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    claims: tuple[str, ...] = ()
    priority: int = 0
    priority_class: str = ""
    preemption_policy: str = "PreemptLowerPriority"
    start_time: str | None = None
    terminating: bool = False
    preferred_node_affinity: tuple[tuple[int, NodeSelectorTerm], ...] = ()
    preferred_affinity: tuple[tuple[int, PodAffinityTerm], ...] = ()
    preferred_anti_affinity: tuple[tuple[int, PodAffinityTerm], ...] = ()
    owner_references: tuple[OwnerReference, ...] = ()
    images: tuple[str, ...] = ()
    scheduling_gates: tuple[str, ...] = ()
    resource_claims: tuple[ClaimRef, ...] = ()
    init_steps: tuple[InitStep, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def controller(self) -> OwnerReference | None:
        """The owner that manages the pod: the first owner reference marked `controller` (None: none is)."""
        return next((owner for owner in self.owner_references if owner.controller), None)

    def total(self, resource: str) -> int:
        """The sum of one resource over the pod's containers."""
        return sum(c.resources.get(resource, 0) for c in self.containers)

    def requested_resources(self) -> set[str]:
        return {r for c in self.containers for r, amount in c.resources.items() if amount > 0}


# ---------------------------------------------------------------------------------------------------------------
# What a pod got (scheduler side)
# ---------------------------------------------------------------------------------------------------------------


class PluginAllocation(BaseModel):
    """One plugin's placement of one pod on one node.

    * `containers`: container name -> resource name -> device ids (strings, as in the annotation);
    * `shares`: container name -> resource name -> device id -> amount, for resources split over shared devices
      (Intel memory per card); absent for whole devices;
    * `fields`: the plugin's own fields, stored in the allocation annotation under `plugins.<plugin name>`;
    * `annotations`: extra pod annotations the plugin wants written (`gas-ts`, `gas-container-cards`).
    """

    model_config = ConfigDict(extra="forbid")

    plugin: str
    containers: dict[str, dict[str, list[str]]] = Field(default_factory=dict)
    shares: dict[str, dict[str, dict[str, int]]] = Field(default_factory=dict)
    fields: dict[str, Any] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    def device_ids(self) -> set[str]:
        return {d for resources in self.containers.values() for ids in resources.values() for d in ids}


class DeviceCell(BaseModel):
    """One device in an occupancy map: who holds it and how much of it is used (0.0 to 1.0).

    `shares`, for a device shared by several pods (each in `holders`), is each sharer's part of `used`: the fraction
    of the device it takes in the dimension `used` reads (the tightest: a GPU 30 % of whose compute and 60 % of whose
    memory are taken is 0.6 used, and its sharers' parts are their memory). Empty for a device held whole or free;
    reports then split a shared device evenly among its holders."""

    id: str
    holders: list[str] = Field(default_factory=list)
    used: float = 0.0
    healthy: bool = True
    shares: dict[str, float] = Field(default_factory=dict)


class Occupancy(BaseModel):
    """A plugin's picture of one node's devices, for reports.

    `layout` says how to draw `cells`: `ring` as one row, `grid` as rows of `columns` cells (a 4x4 torus), `cells` as a
    plain list. `free` counts devices nobody holds; `largest_fit` is the largest request (in devices) the node could
    take now, so `free - largest_fit` is the fragmentation: free devices stranded outside every valid set.

    `topology` names how the devices are linked, for pictures that draw the links: `torus` (rows x `columns`, with
    wrap-around links), `ring`, `cube-mesh` (NVLink hybrid cube-mesh), `nvswitch` (every device reaches every other
    through a switch), or empty (no links known: cards side by side). `links` are the direct device-to-device links
    as pairs of indexes into `cells` (empty for `nvswitch`, whose links all go through the switch).
    """

    family: str
    layout: Literal["ring", "grid", "cells"] = "cells"
    columns: int = 0
    cells: list[DeviceCell] = Field(default_factory=list)
    total: int = 0
    free: int = 0
    largest_fit: int = 0
    topology: str = ""
    links: list[tuple[int, int]] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------
# What a container gets (node side)
# ---------------------------------------------------------------------------------------------------------------


class ContainerAllocation(BaseModel):
    """The part of a verified allocation that concerns one container and one plugin, as the CRI shim hands it over."""

    model_config = ConfigDict(frozen=True)

    pod_uid: str
    node: str
    container: str
    resources: dict[str, list[str]] = Field(default_factory=dict)
    shares: dict[str, dict[str, int]] = Field(default_factory=dict)
    fields: dict[str, Any] = Field(default_factory=dict)


class DeviceNode(BaseModel):
    host_path: str
    container_path: str
    permissions: str = "rwm"


class Mount(BaseModel):
    host_path: str
    container_path: str
    readonly: bool = False


class DeviceOwnership(BaseModel):
    """What selects one plugin's devices in a container's configuration, as the plugin declares it
    (`kubegpu_device_owned`).

    The CRI shim removes every entry a plugin owns from each container that a verified allocation does not grant
    that plugin's devices to, then lets the granted plugins add back exactly their devices; so a user-set
    `NVIDIA_VISIBLE_DEVICES=all`, or a device a vendor device plugin slipped in, never reaches the runtime unallocated.

    * `envs`: env variable names (`NVIDIA_VISIBLE_DEVICES`); `env_prefixes`: name prefixes;
    * `device_paths`: regular expressions a device entry's path must match in full: its container path, or its host
      path with the shim's dev root read as `/dev` (`/dev/nvidia[0-9]+`);
    * `mount_paths`: regular expressions for a mount's container path as the runtime mounts it (`mounted_path`:
      `//x` and `/tmp/../x` are `/x`), matched in full (a runtime that reads device ids from mounts);
    * `cdi_kinds`: CDI kinds (`vendor.com/class`) whose names are removed from the CDI device list and from the
      `cdi.k8s.io/*` annotations.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    envs: tuple[str, ...] = ()
    env_prefixes: tuple[str, ...] = ()
    device_paths: tuple[str, ...] = ()
    mount_paths: tuple[str, ...] = ()
    cdi_kinds: tuple[str, ...] = ()

    @field_validator("envs", "env_prefixes")
    @classmethod
    def _valid_env_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not name or "=" in name:
                raise ValueError(f"{name!r} is not an env variable name")
        return names

    @field_validator("device_paths", "mount_paths")
    @classmethod
    def _valid_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        return patterns

    @field_validator("cdi_kinds")
    @classmethod
    def _valid_kinds(cls, kinds: tuple[str, ...]) -> tuple[str, ...]:
        for kind in kinds:
            if "/" not in kind or "=" in kind:
                raise ValueError(f"{kind!r} is not a CDI kind (vendor.com/class)")
        return kinds

    @classmethod
    def union(cls, owned: Iterable[DeviceOwnership]) -> DeviceOwnership:
        """Everything any of `owned` owns, as one declaration."""
        parts = list(owned)
        return cls(
            envs=tuple(sorted({n for o in parts for n in o.envs})),
            env_prefixes=tuple(sorted({p for o in parts for p in o.env_prefixes})),
            device_paths=tuple(dict.fromkeys(p for o in parts for p in o.device_paths)),
            mount_paths=tuple(dict.fromkeys(p for o in parts for p in o.mount_paths)),
            cdi_kinds=tuple(sorted({k for o in parts for k in o.cdi_kinds})),
        )

    @cached_property
    def _env_names(self) -> frozenset[str]:
        return frozenset(self.envs)

    @cached_property
    def _device_pattern(self) -> re.Pattern[str] | None:
        return _alternation(self.device_paths)

    @cached_property
    def _mount_pattern(self) -> re.Pattern[str] | None:
        return _alternation(self.mount_paths)

    @cached_property
    def _cdi_prefixes(self) -> tuple[str, ...]:
        return tuple(f"{kind}=" for kind in self.cdi_kinds)

    def owns_env(self, name: str) -> bool:
        return name in self._env_names or (bool(self.env_prefixes) and name.startswith(self.env_prefixes))

    def owns_device(self, container_path: str, host_path: str = "", dev_root: str = "/dev") -> bool:
        """Whether a device entry is owned, by its container path or by its host path read relative to `dev_root`."""
        pattern = self._device_pattern
        if pattern is None:
            return False
        if pattern.fullmatch(container_path):
            return True
        if dev_root != "/dev" and host_path.startswith(f"{dev_root}/"):
            host_path = "/dev" + host_path[len(dev_root) :]
        return bool(host_path) and pattern.fullmatch(host_path) is not None

    def owns_mount(self, container_path: str) -> bool:
        """Whether a mount is owned, by its container path as the runtime mounts it: the kubelet passes a volume's
        `mountPath` as written, and the runtime cleans it (`//overrideEnv`, `/tmp/../overrideEnv` mount at
        `/overrideEnv`)."""
        pattern = self._mount_pattern
        return pattern is not None and pattern.fullmatch(mounted_path(container_path)) is not None

    def owns_cdi(self, name: str) -> bool:
        return bool(self._cdi_prefixes) and name.startswith(self._cdi_prefixes)


def mounted_path(container_path: str) -> str:
    """Where a runtime mounts `container_path`: absolute, cleaned (`.`, `..` and repeated or trailing `/` gone)."""
    return "/" + posixpath.normpath("/" + container_path).lstrip("/")


def _alternation(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None


class ContainerEdit(BaseModel):
    """A runtime-neutral copy of the parts of a CRI ContainerConfig that device plugins may change.

    The CRI shim fills it from the request, lets each owning plugin edit it in place, and writes it back; plugins
    never see protobuf. `cdi_devices` are fully qualified CDI names (`vendor.com/class=name`).
    """

    devices: list[DeviceNode] = Field(default_factory=list)
    envs: dict[str, str] = Field(default_factory=dict)
    mounts: list[Mount] = Field(default_factory=list)
    cdi_devices: list[str] = Field(default_factory=list)
    annotations: dict[str, str] = Field(default_factory=dict)

    def replace_devices(self, pattern: str, devices: Iterable[DeviceNode]) -> None:
        """Make `devices` the only device entries whose container path matches `pattern` (a regular expression, in
        full): entries already there for a wanted path stay as they are, other matching entries are removed, the
        missing ones are appended in the order given."""
        compiled = re.compile(pattern)
        wanted = list(devices)
        paths = {d.container_path for d in wanted}
        self.devices = [
            d for d in self.devices if not compiled.fullmatch(d.container_path) or d.container_path in paths
        ]
        present = {d.container_path for d in self.devices}
        self.devices.extend(d for d in wanted if d.container_path not in present)

    def replace_cdi_devices(self, kind: str, names: list[str]) -> None:
        """Make `names` the only CDI devices of `kind` (`vendor.com/class`), in `cdi_devices` and in the
        `cdi.k8s.io/*` annotations alike (an annotation left empty is dropped)."""
        prefix = f"{kind}="
        self.cdi_devices = [n for n in self.cdi_devices if not n.startswith(prefix)] + names
        for key in [k for k in self.annotations if k.startswith(CDI_ANNOTATION_PREFIX)]:
            kept = [n for n in (p.strip() for p in self.annotations[key].split(",")) if n and not n.startswith(prefix)]
            if kept:
                self.annotations[key] = ",".join(kept)
            else:
                del self.annotations[key]

    def remove_owned(self, owned: DeviceOwnership, dev_root: str = "/dev") -> list[str]:
        """Remove every env variable, device, mount and CDI name that `owned` owns (CDI names in `cdi.k8s.io/*`
        annotations too; an annotation left empty is dropped); what was removed, for the log."""
        names = [name for name in self.envs if owned.owns_env(name)]
        for name in names:
            del self.envs[name]
        removed = [f"env {name}" for name in names]
        devices = [d for d in self.devices if not owned.owns_device(d.container_path, d.host_path, dev_root)]
        if len(devices) != len(self.devices):
            removed += [f"device {d.container_path}" for d in self.devices if d not in devices]
            self.devices = devices
        mounts = [m for m in self.mounts if not owned.owns_mount(m.container_path)]
        if len(mounts) != len(self.mounts):
            removed += [f"mount {m.container_path}" for m in self.mounts if m not in mounts]
            self.mounts = mounts
        cdi = [n for n in self.cdi_devices if not owned.owns_cdi(n)]
        if len(cdi) != len(self.cdi_devices):
            removed += [f"CDI device {n}" for n in self.cdi_devices if n not in cdi]
            self.cdi_devices = cdi
        for key in [k for k in self.annotations if k.startswith(CDI_ANNOTATION_PREFIX)]:
            listed = [n for n in (p.strip() for p in self.annotations[key].split(",")) if n]
            kept = [n for n in listed if not owned.owns_cdi(n)]
            if len(kept) == len(listed):
                continue
            removed += [f"CDI device {n} (annotation {key})" for n in listed if n not in kept]
            if kept:
                self.annotations[key] = ",".join(kept)
            else:
                del self.annotations[key]
        return removed


class Advertisement(BaseModel):
    """How a node advertises one plugin's devices: extended-resource capacity and node labels."""

    capacity: dict[str, int] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
