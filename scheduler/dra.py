"""Allocating DRA claims (kube-scheduler's DynamicResources plugin and its structured allocator), for the engine.

`DraBook` holds what the cluster says about devices: DeviceClasses, ResourceSlices (the devices each node sees),
ResourceClaimTemplates and ResourceClaims (`kubegpu.core.dra` decodes them), and which device each allocated claim
holds. For a pod and a node it answers whether the pod's claims can be allocated there (Filter: `fit`), which
devices they get (Reserve: `allocate`), and takes (`hold`) and gives back (`give_back`) the claims for the pod, so a
device is never allocated to two claims, and a claim is deallocated when the last pod reserving it goes (as
kube-controller-manager's resourceclaim controller does). The engine calls it from `plan` (PreFilter and signatures),
`kubefilters.DynamicResources` (Filter), `reserving` (Reserve) and `cache` (a pod entered or released).

The rules, as kube-scheduler 1.34's allocator reads a claim: each request picks devices visible to the node (slices of
the node, or of all nodes or a node selector matching it; of each pool, only its newest generation) that are not
allocated to another claim, that its DeviceClass's and its own CEL selectors accept, `count` of them (`ExactCount`)
or every matching device (`All`, refused when one of them is in use); a `firstAvailable` request takes the first of
its alternatives that can be satisfied; a `matchAttribute` constraint makes the devices of the requests it names share
one value of the attribute. A request with `adminAccess` (DRAAdminAccess, on by default from 1.34) may take devices
other claims hold, and holds none itself (its results say `adminAccess: true`); it is allocated only in a namespace
labelled `resource.kubernetes.io/admin-access: "true"`, in the API server's words when not (`admin_namespaces`: the
scheduler reads namespaces' labels, `kubegpu simulate` its Namespace documents; none read, none has it).
Beyond what upstream can express, devices of kubegpu's own drivers are chosen by the
device plugins' placement rules (`TOPOLOGY_RULES`): a Neuron request takes a contiguous window of a ring or whole
rows of a torus, the one that fragments least (`plugins.neuron.topology`), and an NVIDIA request the best-connected
GPUs of the NVLink group tree (`plugins.nvidia.topology`).

CEL selectors run with cel-python (never an interpreter of kubegpu's own; `kubegpu.scheduler.dracel`, imported at the
first selector evaluated), in upstream's environment: `device.driver`,
`device.attributes["domain"].name`, `device.capacity["domain"].name` (quantities: `quantity("1Gi")`, `compareTo`,
`isGreaterThan`, `isLessThan`, `asInteger`), a missing domain being an empty map. Each expression is compiled once,
and its cost bounded before it runs (at most `MAX_CEL_TOKENS` tokens, no comprehension inside another, so at most
about a million steps, upstream's own limit); a device's answer is remembered per what a selector can read of it
(`Device.facts`), so devices alike answer from memory. An expression that fails to compile or to run refuses with its
error, naming the class or claim, request and selector.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, NamedTuple

from kubegpu.core.dra import (
    ADMIN_NAMESPACE_LABEL,
    Claim,
    ClaimSpec,
    Constraint,
    Device,
    DeviceClass,
    Request,
    Slice,
    Template,
)
from kubegpu.core.models import ClaimRef, NodeSelectorTerm, PodRequest, Requirement
from kubegpu.core.status import Status
from kubegpu.core.text import safe_text
from kubegpu.plugins.neuron import topology as neuron_topology
from kubegpu.plugins.nvidia import topology as nvidia_topology
from kubegpu.scheduler.filters import node_matches_terms

log = logging.getLogger("kubegpu.dra")

__all__ = [
    "CANNOT_ALLOCATE",
    "NOT_AVAILABLE",
    "DraBook",
    "HeldClaim",
    "PodClaims",
    "allocation_shape",
]

# kube-scheduler's DynamicResources wording.
CANNOT_ALLOCATE = "cannot allocate all claims"
NOT_AVAILABLE = "resourceclaim not available on the node"
IN_USE = "resourceclaim in use"
# Tries (an alternative of a request, a group of devices for it) the depth-first search of one claim on one node may
# make: requests times firstAvailable alternatives times constraint values multiply (8^31 for a tenant's 32 requests
# of 8 alternatives), and upstream bounds the same search by time (DRASchedulerFilterTimeout, 10 s a pod).
MAX_SEARCH_STEPS = 2000
MAX_REMEMBERED = 1 << 16
_NO_HOLDERS: dict[tuple[str, str], None] = {}
SHARED_FREE = 1 << 40  # a node's free devices when slices are shared between nodes: not counted, never the reason
NEURON_DRIVER = "neuron.kubegpu.io"
NVIDIA_DRIVER = "nvidia.kubegpu.io"
INTEL_DRIVER = "gpu.intel.kubegpu.io"


# -- records ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Visible:
    """One device a node sees, with the node selector an allocation of it carries (None: every node), written and
    read."""

    device: Device
    node_selector: Mapping[str, Any] | None
    node_terms: tuple[NodeSelectorTerm, ...] | None


@dataclass(slots=True)
class Entry:
    """One of a pod's claims in an allocation: the claim as it is once the pod holds it, and whether the pod's own
    (made from a template for it: it goes with the pod)."""

    ref: str
    claim: Claim
    owned: bool


class HeldClaim(NamedTuple):
    """A front-end's copy of one of a pod's claims as the engine holds it (`Engine.held_claims`)."""

    ref: str  # the pod's name for the claim (`spec.resourceClaims[].name`)
    claim: Claim  # allocated and reserved for the pod
    owned: bool  # made from a template for the pod


@dataclass(slots=True)
class PodClaims:
    """What a pod holds through its claims (`DraBook.allocate`), entered and given back with the pod."""

    entries: list[Entry] = field(default_factory=list)

    def held(self) -> list[HeldClaim]:
        return [HeldClaim(e.ref, e.claim, e.owned) for e in self.entries]

    def shown(self) -> dict[str, dict[str, Any]]:
        """Each claim as a front-end shows it: pod claim name -> {name, allocation (upstream shape), reservedFor}."""
        return {
            e.ref: {
                "name": e.claim.name,
                "allocation": dict(e.claim.allocation or {}),
                "reservedFor": [dict(c) for c in e.claim.reserved_for],
            }
            for e in self.entries
        }


def node_name_selector(node: str) -> dict[str, Any]:
    """The node selector of an allocation of node-local devices, as upstream writes it."""
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def node_name_terms(node: str) -> tuple[NodeSelectorTerm, ...]:
    return (NodeSelectorTerm(fields=(Requirement("metadata.name", "In", (node,)),)),)


def allocation_shape(
    results: Sequence[tuple[str, Device, bool]],
    config: Sequence[Mapping[str, Any]],
    node_selector: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """`status.allocation` in the upstream shape: devices.results (request, driver, pool, device), devices.config
    (class configuration first, then the claim's), nodeSelector."""
    allocation: dict[str, Any] = {
        "devices": {
            "results": [
                {
                    "request": request,
                    "driver": d.driver,
                    "pool": d.pool,
                    "device": d.name,
                    **({"adminAccess": True} if admin else {}),
                }
                for request, d, admin in results
            ],
            "config": [dict(c) for c in config],
        }
    }
    if node_selector is not None:
        allocation["nodeSelector"] = dict(node_selector)
    return allocation


# -- topology rules of kubegpu's own drivers --------------------------------------------------------------------------


def _int(device: Device, name: str) -> int | None:
    value = device.attributes.get((device.driver, name))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _neuron_pick(candidates: Sequence[Device], count: int) -> list[Device] | None:
    """`count` devices forming a valid Neuron set (a ring window, torus rows), fragmenting least."""
    first = candidates[0]
    total = _int(first, "deviceCount")
    kind = first.attributes.get((first.driver, "topology"))
    by_index = {i: d for d in candidates if (i := _int(d, "index")) is not None}
    if total is None or len(by_index) != len(candidates) or not 0 < total <= 1024:
        return None
    rows, columns = _int(first, "rows") or 0, _int(first, "columns") or 0
    shape = neuron_topology.make_topology(str(kind or "ring"), total, rows, columns)
    free = 0
    for i in by_index:
        if 0 <= i < total:
            free |= 1 << i
    mask = neuron_topology.choose_devices(shape, 1, free, free, count)
    if mask is None:
        return []
    return [by_index[i] for i in neuron_topology.bit_ids(mask)]


@lru_cache(maxsize=1024)
def _nvlink_tree(gpus: int, paths: tuple[tuple[int, str], ...]) -> nvidia_topology.GroupTree:
    """The group tree of a node's GPUs from each GPU's `nvlinkGroup` path ("0.1": second group inside the first)."""
    nested: dict[str, Any] = {}
    for index, path in paths:
        level = nested
        for part in path.split(".") if path else ():
            level = level.setdefault(part, {})
        level.setdefault("", []).append(index)

    def groups(level: dict[str, Any]) -> list[Any]:
        members: list[Any] = list(level.get("", []))
        members.extend(groups(child) for key, child in sorted(level.items()) if key)
        return members

    return nvidia_topology.build_tree("dra", gpus, groups(nested))


def _nvidia_pick(candidates: Sequence[Device], count: int) -> list[Device] | None:
    """The best-connected `count` GPUs of the node's NVLink group tree (`nvlinkGroup` paths)."""
    first = candidates[0]
    total = _int(first, "gpuCount")
    by_index = {i: d for d in candidates if (i := _int(d, "index")) is not None}
    if total is None or len(by_index) != len(candidates) or not 0 < total <= 1024:
        return None
    paths = tuple(sorted((i, str(d.attributes.get((d.driver, "nvlinkGroup"), ""))) for i, d in by_index.items()))
    try:
        tree = _nvlink_tree(total, paths)
    except nvidia_topology.TopologyError:
        return None
    free = 0
    for i in by_index:
        if 0 <= i < total:
            free |= 1 << i
    chosen = nvidia_topology.choose(tree, free, count)
    if chosen is None:
        return []
    return [by_index[i] for i in range(total) if chosen[0] >> i & 1]


# driver -> rule: the devices to take among one pool's candidates (ordered), [] when no valid set is free, None
# when the devices do not carry the attributes the rule reads (then the first `count` are taken, as upstream).
TOPOLOGY_RULES: dict[str, Callable[[Sequence[Device], int], list[Device] | None]] = {
    NEURON_DRIVER: _neuron_pick,
    NVIDIA_DRIVER: _nvidia_pick,
}


# -- the book ---------------------------------------------------------------------------------------------------------


class _SearchBound(Exception):
    """The claim's search on this node made `MAX_SEARCH_STEPS` tries."""


class Refusal(Exception):
    def __init__(self, status: Status) -> None:
        super().__init__(status.message)
        self.status = status


@dataclass(slots=True)
class _Demand:
    ref: ClaimRef
    key: tuple[str, str]
    spec: ClaimSpec
    claim: Claim | None  # the existing claim (None: made from its template at Reserve)
    owned: bool


class DraBook:
    """Everything DRA the engine knows: classes, slices, templates, claims, and the devices allocated."""

    def __init__(self) -> None:
        self.classes: dict[str, DeviceClass] = {}
        self.templates: dict[tuple[str, str], Template] = {}
        self.claims: dict[tuple[str, str], Claim] = {}
        self.slices: dict[str, Slice] = {}
        self._pools: dict[tuple[str, str], dict[str, Slice]] = {}  # (driver, pool) -> its slices by name
        self._node_slices: dict[str, dict[str, Slice]] = {}  # node ("*": shared) -> its slices by name
        self._local: dict[str, list[Visible]] = {}  # node -> the node-local devices it sees (newest generations)
        self._shared: list[Slice] = []  # slices of all nodes or of a node selector
        self.in_use: dict[tuple[str, str, str], tuple[str, str]] = {}  # device -> a claim allocated it
        # device -> every claim whose allocation names it, oldest first: two schedulers racing may allocate one
        # device to two claims, and it stays in use until the last of them lets it go.
        self._holders: dict[tuple[str, str, str], dict[tuple[str, str], None]] = {}
        # Bumped when a class, template or claim changes other than by this engine's own Reserve of a pod's claim
        # made from a template (which changes only the node's devices in use, and so its version).
        self.epoch = 0
        self.shared_epoch = 0  # a device of a shared slice was allocated or freed: any node's answers may change
        # (selector expression, device facts) -> True, False, or the error message. Past MAX_REMEMBERED, cleared.
        self._answers: dict[tuple[str, tuple[object, ...]], bool | str] = {}
        # (class selectors, request selectors, device facts) -> whether both accept (a refusal is never remembered
        # here: it raises). Past MAX_REMEMBERED, cleared.
        self._both: dict[tuple[tuple[str, ...], tuple[str, ...], tuple[object, ...]], bool] = {}
        # The namespaces labelled `resource.kubernetes.io/admin-access: "true"`: the only ones whose claims' admin
        # access requests are allocated (devices other claims hold).
        self.admin_namespaces: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.slices or self.claims or self.classes)

    def forget_memos(self) -> None:
        """Drop the remembered selector answers (the engine's oracle tests)."""
        self._answers.clear()
        self._both.clear()

    # -- objects --------------------------------------------------------------------------------------------------

    def set_class(self, name: str, found: DeviceClass | None) -> None:
        if found is None:
            self.classes.pop(name, None)
        else:
            self.classes[name] = found
        self.epoch += 1

    def set_namespace(self, name: str, labels: Mapping[str, str] | None) -> bool:
        """A Namespace added or changed with its labels, or deleted (None). Returns whether it changed what admin
        access its claims may have."""
        admin = labels is not None and labels.get(ADMIN_NAMESPACE_LABEL) == "true"
        if admin == (name in self.admin_namespaces):
            return False
        if admin:
            self.admin_namespaces.add(name)
        else:
            self.admin_namespaces.discard(name)
        self.epoch += 1
        return True

    def set_template(self, key: tuple[str, str], found: Template | None) -> None:
        if found is None:
            self.templates.pop(key, None)
        else:
            self.templates[key] = found
        self.epoch += 1

    def set_claim(self, key: tuple[str, str], found: Claim | None) -> set[str]:
        """A ResourceClaim added, changed (its allocation written by someone) or deleted. Returns the nodes whose
        devices in use changed."""
        old = self.claims.pop(key, None)
        touched = self._free(old) if old is not None else set()
        if found is not None:
            self.claims[key] = found
            touched |= self._take(found)
        self.epoch += 1
        return touched

    def set_slice(self, name: str, found: Slice | None) -> set[str]:
        """A ResourceSlice added, changed or deleted. Returns the nodes whose visible devices changed ("*": all)."""
        old = self.slices.pop(name, None)
        if found is not None:
            self.slices[name] = found
        touched: set[str] = set()
        for piece in (old, found):
            if piece is None:
                continue
            pool = (piece.driver, piece.pool)
            members = self._pools.setdefault(pool, {})
            here = self._node_slices.setdefault(piece.node_name or "*", {})
            if piece is old:
                members.pop(name, None)
                here.pop(name, None)
            else:
                members[name] = piece
                here[name] = piece
            if not members:
                del self._pools[pool]
            # Every node of the pool: a newer generation hides the older slices of all of them.
            touched.update(s.node_name or "*" for s in (*members.values(), piece))
        for node in touched - {"*"}:
            self._index_node(node)
        if "*" in touched:
            self._shared = [
                s for s in sorted(self.slices.values(), key=lambda s: s.name) if s.node_name is None and self._newest(s)
            ]
        return touched

    def _newest(self, piece: Slice) -> bool:
        """Whether the slice is of its pool's newest generation (older ones are being replaced: not used)."""
        members = self._pools.get((piece.driver, piece.pool), {})
        return piece.generation == max(s.generation for s in members.values())

    def _index_node(self, node: str) -> None:
        selector, terms = node_name_selector(node), node_name_terms(node)
        found = [
            Visible(d, selector, terms)
            for s in sorted(self.slices_of(node), key=lambda s: s.name)
            if self._newest(s)
            for d in s.devices
        ]
        if found:
            self._local[node] = found
        else:
            self._local.pop(node, None)

    def slices_of(self, node: str) -> list[Slice]:
        return list(self._node_slices.get(node, {}).values())

    def visible(self, node: str, labels: Mapping[str, str]) -> list[Visible]:
        """The devices node `node` sees: its own slices' and the shared slices matching it."""
        found = list(self._local.get(node, ()))
        for s in self._shared:
            if s.all_nodes:
                found.extend(Visible(d, None, None) for d in s.devices)
            elif s.node_terms is not None and node_matches_terms(s.node_terms, node, labels):
                found.extend(Visible(d, s.node_selector, s.node_terms) for d in s.devices)
        return found

    def nodes_of(self, devices: Iterable[tuple[str, str, str]]) -> set[str]:
        """The nodes that see the devices' pools ("*": a shared slice's, any node)."""
        pools = {(d[0], d[1]) for d in devices}
        return {s.node_name or "*" for pool in pools for s in self._pools.get(pool, {}).values()}

    def free_devices(self, node: str) -> int:
        """How many devices the node sees that no claim holds: the capacity index DRA pods are selected by (a lower
        bound is all it must be; with shared slices, any node may see more: `SHARED_FREE`)."""
        if self._shared:
            return SHARED_FREE
        in_use = self.in_use
        return sum(1 for v in self._local.get(node, ()) if v.device.id not in in_use)

    def min_devices(self, pod: PodRequest) -> int:
        """The fewest devices the pod's claims not yet allocated can take (0 when a claim or template is missing:
        the PreFilter refuses the pod then)."""
        total = 0
        for ref in pod.resource_claims:
            claim = self.claims.get((pod.namespace, ref.claim_name or ref.generated or claim_for_pod(pod, ref)))
            if claim is not None or ref.template_name is None:
                spec = claim.spec if claim is not None and claim.allocation is None else None
            else:
                template = self.templates.get((pod.namespace, ref.template_name))
                spec = template.spec if template is not None else None
            for request in spec.requests if spec is not None else ():
                total += min(
                    0 if r.admin_access else 1 if r.mode == "All" else r.count
                    for r in request.alternatives or (request,)
                )
        return total

    def _take(self, claim: Claim) -> set[str]:
        held = [d for d, admin in claim.allocated_devices() if not admin]
        for device in held:
            holders = self._holders.setdefault(device, {})
            holders[claim.key] = None
            self.in_use[device] = next(iter(holders))
        return self._touched(held)

    def _free(self, claim: Claim) -> set[str]:
        held = [
            d for d, admin in claim.allocated_devices() if not admin and claim.key in self._holders.get(d, _NO_HOLDERS)
        ]
        for device in held:
            holders = self._holders[device]
            del holders[claim.key]
            if holders:
                self.in_use[device] = next(iter(holders))
            else:
                del self._holders[device], self.in_use[device]
        return self._touched(held)

    def _touched(self, devices: list[tuple[str, str, str]]) -> set[str]:
        if not devices:
            return set()
        nodes = self.nodes_of(devices)
        if "*" in nodes:
            self.shared_epoch += 1
        return nodes

    # -- a pod's claims (PreFilter) -------------------------------------------------------------------------------

    def demands(self, pod: PodRequest) -> list[_Demand] | Status:
        """The pod's claims, each with the spec to allocate and the claim as it is; or kube-scheduler's refusal
        (a claim not found, being deleted, reserved for as many pods as it may be, or a class that does not
        exist)."""
        found = []
        for ref in pod.resource_claims:
            name = ref.claim_name or ref.generated or claim_for_pod(pod, ref)
            claim = self.claims.get((pod.namespace, name))
            if claim is None and ref.claim_name is None and ref.generated is None:
                # Made from its template for this pod at Reserve (the resourceclaim controller's part).
                template = self.templates.get((pod.namespace, ref.template_name or ""))
                if template is None:
                    return Status.unresolvable(f'resourceclaimtemplate "{ref.template_name}" not found')
                if template.problem is not None:
                    return Status.unresolvable(
                        safe_text(f'resourceclaimtemplate "{ref.template_name}" cannot be read: {template.problem}')
                    )
                found.append(_Demand(ref, (pod.namespace, name), template.spec, None, True))
                continue
            if claim is None:
                return Status.unresolvable(f'resourceclaim "{name}" not found')
            if ref.claim_name is None and claim.owner != pod.uid:
                # A claim of that name made for another pod (or by anyone else) is never taken as this pod's own.
                return Status.unresolvable(f'resourceclaim "{name}" was not created for the pod')
            if claim.deleting:
                return Status.unresolvable(f'resourceclaim "{name}" is being deleted')
            if claim.problem is not None and claim.allocation is None:
                return Status.unresolvable(safe_text(f'resourceclaim "{name}" cannot be read: {claim.problem}'))
            mine = any(c.get("uid") == pod.uid for c in claim.reserved_for)
            if not mine and len(claim.reserved_for) >= 256:
                return Status.unresolvable(IN_USE)
            found.append(_Demand(ref, claim.key, claim.spec, claim, ref.claim_name is None))
        for demand in found:
            if demand.claim is not None and demand.claim.allocation is not None:
                continue
            for request in demand.spec.requests:
                if request.admin_access and pod.namespace not in self.admin_namespaces:
                    # The API server's refusal of such a claim (kubegpu may read one no API server checked, or one
                    # whose namespace lost the label since): its requests would reach devices other tenants hold.
                    return Status.unresolvable(
                        f"request {request.name}: admin access to devices requires the `{ADMIN_NAMESPACE_LABEL}: "
                        "true` label on the containing namespace"
                    )
                for choice in request.alternatives or (request,):
                    if choice.class_name not in self.classes:
                        return Status.unresolvable(
                            f"request {choice.name}: device class {choice.class_name} does not exist"
                        )
        return self._selectors_bounded(found)

    def _selectors_bounded(self, found: list[_Demand]) -> list[_Demand] | Status:
        """The demands, unless the selectors they evaluate together are more than kubegpu keeps compiled
        (`dracel.MAX_POD_NODES`): each would be compiled again for every device of other facts."""
        expressions: set[str] = set()
        for demand in found:
            if demand.claim is None or demand.claim.allocation is None:
                for request in demand.spec.requests:
                    for choice in request.alternatives or (request,):
                        expressions.update(self.classes[choice.class_name].selectors, choice.selectors)
        if not expressions:
            return found
        from kubegpu.scheduler import dracel  # cel-python only once DRA is used

        total = sum(map(dracel.weight, expressions))
        if total > dracel.MAX_POD_NODES:
            return Status.unresolvable(
                f"the pod's CEL selectors together are over kubegpu's cost bound: {total} parse-tree nodes, at most "
                f"{dracel.MAX_POD_NODES} (fewer or shorter selectors)"
            )
        return found

    def demand_key(self, pod: PodRequest) -> tuple[object, ...]:
        """What the pod's DRA answers depend on besides the node: each claim's spec (a template's is shared by every
        pod made from it) or the claim itself, and the epochs."""
        key: list[object] = [self.epoch, self.shared_epoch]
        for ref in pod.resource_claims:
            claim = self.claims.get((pod.namespace, ref.claim_name or ref.generated or claim_for_pod(pod, ref)))
            key.append(claim)
            if claim is None and ref.template_name is not None:
                template = self.templates.get((pod.namespace, ref.template_name))
                key.append(template.spec if template is not None else None)
        return tuple(key)

    # -- Filter and Reserve ---------------------------------------------------------------------------------------

    def fit(self, node: str, labels: Mapping[str, str], pod: PodRequest) -> Status | None:
        """Whether the pod's claims can all be allocated (or are allocated) for the node: None, or the refusal."""
        outcome = self.allocate(node, labels, pod)
        return outcome if isinstance(outcome, Status) else None

    def allocate(self, node: str, labels: Mapping[str, str], pod: PodRequest) -> PodClaims | Status:
        """The claims the pod would hold on the node: each allocated (if it was not) and reserved for the pod."""
        demands = self.demands(pod)
        if isinstance(demands, Status):
            return demands
        visible: list[Visible] | None = None
        taken: set[tuple[str, str, str]] = set()
        entries = []
        consumer = {"resource": "pods", "name": pod.name, "uid": pod.uid}
        for demand in demands:
            claim = demand.claim
            if claim is not None and claim.allocation is not None:
                if claim.node_terms is not None and not node_matches_terms(claim.node_terms, node, labels):
                    return Status.unresolvable(NOT_AVAILABLE)
                reserved = claim.reserved_for
                if not any(c.get("uid") == pod.uid for c in reserved):
                    reserved = (*reserved, consumer)
                entries.append(Entry(demand.ref.name, replace(claim, reserved_for=reserved), demand.owned))
                continue
            if visible is None:
                visible = self.visible(node, labels)
            try:
                allocation, terms = self._allocate_claim(demand, visible, taken, node)
            except Refusal as refusal:
                return refusal.status
            if claim is None:
                claim = Claim(
                    demand.key[0], demand.key[1], _claim_uid(pod, demand.ref.name), demand.spec, None, owner=pod.uid
                )
            allocated = replace(claim, allocation=allocation, reserved_for=(consumer,), node_terms=terms)
            entries.append(Entry(demand.ref.name, allocated, demand.owned))
        return PodClaims(entries)

    def _allocate_claim(
        self, demand: _Demand, visible: list[Visible], taken: set[tuple[str, str, str]], node: str
    ) -> tuple[dict[str, Any], tuple[NodeSelectorTerm, ...] | None]:
        spec = demand.spec
        where = f"claim {demand.key[0]}/{demand.key[1]}"
        chosen: list[tuple[str, Visible, bool]] = []
        steps = [MAX_SEARCH_STEPS]
        try:
            solved = self._solve(spec, spec.requests, 0, visible, taken, chosen, {}, where, steps)
        except _SearchBound:  # (`taken` is the refused pod's own: the caller drops it)
            raise Refusal(
                Status.unschedulable(
                    f"{CANNOT_ALLOCATE}: {where}: more than {MAX_SEARCH_STEPS} tries to place its requests on a node "
                    "(kubegpu's bound on the search: fewer requests, firstAvailable alternatives or constraint values "
                    "make it cheaper)"
                )
            ) from None
        if not solved:
            raise Refusal(Status.unschedulable(CANNOT_ALLOCATE))
        config: list[dict[str, Any]] = []
        used_classes: list[str] = []
        requests_of_class: dict[str, list[str]] = {}
        for request in _flat(spec.requests):
            if any(name == request.name for name, _, _ in chosen):
                requests_of_class.setdefault(request.class_name, []).append(request.name)
                if request.class_name not in used_classes:
                    used_classes.append(request.class_name)
        for class_name in used_classes:
            for opaque in self.classes[class_name].config:
                config.append({"source": "FromClass", "requests": requests_of_class[class_name], "opaque": opaque})
        for item in spec.config:
            config.append({"source": "FromClaim", **item})
        # One device's node selector if they all share it; else the node's own (what all of them reach).
        selectors = {id(v.node_terms): v for _, v, _ in chosen}
        if len(selectors) == 1:
            first = next(iter(selectors.values()))
            node_selector, terms = first.node_selector, first.node_terms
        else:
            node_selector, terms = node_name_selector(node), node_name_terms(node)
        results = [(name, v.device, admin) for name, v, admin in chosen]
        return allocation_shape(results, config, node_selector), terms

    def _solve(
        self,
        spec: ClaimSpec,
        requests: Sequence[Request],
        index: int,
        visible: list[Visible],
        taken: set[tuple[str, str, str]],
        chosen: list[tuple[str, Visible, bool]],
        bound: dict[tuple[str, str], object],
        where: str,
        steps: list[int],
    ) -> bool:
        """Depth first over the requests: each alternative of a request, each value its unbound constraints may
        take; True with `chosen` filled (and `taken` grown) when every request is satisfied. `steps`: the tries left
        (`MAX_SEARCH_STEPS`); raises `_SearchBound` past them."""
        if index == len(requests):
            return True
        request = requests[index]
        for choice in request.alternatives or (request,):
            steps[0] -= 1
            if steps[0] < 0:
                raise _SearchBound
            constraints = [c for c in spec.constraints if _applies(c, choice.name, request.name)]
            candidates = self._candidates(choice, visible, taken, where)
            if candidates is None:
                continue
            free = [v for v in candidates if v.device.id not in taken]
            attributes = [c.match_attribute for c in constraints]
            for values, group in _groups(free, attributes, bound):
                steps[0] -= 1
                if steps[0] < 0:
                    raise _SearchBound
                picked = self._pick(choice, group, candidates)
                if picked is None:
                    continue
                fresh = {a: v for a, v in zip(attributes, values, strict=True) if a not in bound}
                bound.update(fresh)
                ids = [v.device.id for v in picked]
                if not choice.admin_access:
                    taken.update(ids)
                chosen.extend((choice.name, v, choice.admin_access) for v in picked)
                if self._solve(spec, requests, index + 1, visible, taken, chosen, bound, where, steps):
                    return True
                del chosen[len(chosen) - len(picked) :]
                if not choice.admin_access:
                    taken.difference_update(ids)
                for a in fresh:
                    del bound[a]
        return False

    def _candidates(
        self, request: Request, visible: list[Visible], taken: set[tuple[str, str, str]], where: str
    ) -> list[Visible] | None:
        """The visible devices the request's class and selectors accept (in use or not); None when a device in use
        rules the request out (`All`)."""
        device_class = self.classes[request.class_name]
        found = []
        both = self._both
        in_use = self.in_use
        for v in visible:
            device = v.device
            # Both lists' answer for devices alike in facts, in one look-up (the first of each facts asks each list).
            key = (device_class.selectors, request.selectors, device.facts)
            accepted = both.get(key)
            if accepted is None:
                accepted = self._accepts(device_class.selectors, device, f"class {device_class.name}") and (
                    self._accepts(request.selectors, device, f"{where}, request {request.name}")
                )
                if len(both) >= MAX_REMEMBERED:
                    both.clear()
                both[key] = accepted
            if not accepted:
                continue
            if not request.admin_access and device.id in in_use:
                if request.mode == "All":
                    return None
                continue
            found.append(v)
        return found

    def _pick(self, request: Request, group: list[Visible], candidates: list[Visible]) -> list[Visible] | None:
        if request.mode == "All":
            if not group or len(group) != len(candidates) or len(group) > 32:
                return None
            return group
        count = request.count
        if len(group) < count:
            return None
        by_pool: dict[tuple[str, str], list[Visible]] = {}
        for v in group:
            by_pool.setdefault((v.device.driver, v.device.pool), []).append(v)
        for pool, members in by_pool.items():
            rule = TOPOLOGY_RULES.get(pool[0])
            if rule is None:
                continue
            picked = rule([v.device for v in members], count)
            if picked is None:
                continue  # the devices do not say their topology: taken as they come
            if picked:
                ids = {id(d) for d in picked}
                return [v for v in members if id(v.device) in ids]
            group = [v for v in group if (v.device.driver, v.device.pool) != pool]  # no valid set free there
        if len(group) < count:
            return None
        return group[:count]

    def _accepts(self, selectors: tuple[str, ...], device: Device, where: str) -> bool:
        answers = self._answers
        for number, expression in enumerate(selectors):
            key = (expression, device.facts)
            answer = answers.get(key)
            if answer is None:
                from kubegpu.scheduler import dracel  # cel-python (with pendulum and Lark) only once DRA is used

                answer = dracel.evaluate(expression, device)
                if len(answers) >= MAX_REMEMBERED:
                    answers.clear()
                answers[key] = answer
            if isinstance(answer, str):
                raise Refusal(Status.unresolvable(safe_text(f"{where}: selector #{number}: {answer}")))
            if not answer:
                return False
        return True

    # -- holding and giving back ----------------------------------------------------------------------------------

    def hold(self, held: PodClaims) -> set[str]:
        """Enter the pod's claims as `allocate` made them: allocated devices are in use. Returns the nodes touched."""
        touched: set[str] = set()
        for entry in held.entries:
            current = self.claims.get(entry.claim.key)
            if current is not None:
                touched |= self._free(current)
            self.claims[entry.claim.key] = entry.claim
            touched |= self._take(entry.claim)
            if not entry.owned or current is not None:
                self.epoch += 1
        return touched

    def reserved_by(self, pod: PodRequest) -> PodClaims | None:
        """The claims reserved for the pod as the cluster says (a bound pod the engine counted without placing it:
        after a restart, the claims' informer may report them after the pod), for `give_back`; None: none is."""
        entries = []
        for ref in pod.resource_claims:
            claim = self.claims.get((pod.namespace, ref.claim_name or ref.generated or claim_for_pod(pod, ref)))
            if claim is not None and any(c.get("uid") == pod.uid for c in claim.reserved_for):
                entries.append(Entry(ref.name, claim, ref.claim_name is None and claim.owner == pod.uid))
        return PodClaims(entries) if entries else None

    def give_back(self, held: PodClaims, uid: str) -> set[str]:
        """The pod is gone: it leaves each claim's reservedFor; a claim no pod reserves any more is deallocated, one
        made for the pod from a template is deleted (kube-controller-manager's resourceclaim controller)."""
        touched: set[str] = set()
        for entry in held.entries:
            current = self.claims.get(entry.claim.key)
            if current is None:
                continue
            reserved = tuple(c for c in current.reserved_for if c.get("uid") != uid)
            if reserved:
                self.claims[current.key] = replace(current, reserved_for=reserved)
                self.epoch += 1
                continue
            touched |= self._free(current)
            if entry.owned and entry.claim.name == current.name:
                del self.claims[current.key]
            else:
                self.claims[current.key] = replace(current, allocation=None, reserved_for=())
                self.epoch += 1
        return touched


def claim_for_pod(pod: PodRequest, ref: ClaimRef) -> str:
    """The name of the claim kubegpu makes from a template for the pod (`<pod>-<claim>`): fixed, so that a restarted
    scheduler, or one whose write's answer was lost, finds the claim it made, where the pod's
    `status.resourceClaimStatuses` (which the resourceclaim controller writes, and kubegpu too) is not read back."""
    return f"{pod.name}-{ref.name}"


def _claim_uid(pod: PodRequest, ref: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kubegpu:resourceclaim:{pod.uid}/{ref}"))


def _flat(requests: Iterable[Request]) -> Iterable[Request]:
    for request in requests:
        yield from request.alternatives or (request,)


def _applies(constraint: Constraint, name: str, parent: str) -> bool:
    return not constraint.requests or name in constraint.requests or parent in constraint.requests


def _groups(
    free: list[Visible], attributes: list[tuple[str, str]], bound: Mapping[tuple[str, str], object]
) -> Iterable[tuple[tuple[object, ...], list[Visible]]]:
    """The free devices grouped by their values of the constrained attributes (devices lacking one are out; a value
    already bound by an earlier request is the only one allowed), in order of first appearance."""
    if not attributes:
        yield (), free
        return
    groups: dict[tuple[object, ...], list[Visible]] = {}
    for v in free:
        values = []
        for attribute in attributes:
            value = v.device.attributes.get(attribute)
            if value is None or (attribute in bound and bound[attribute] != value):
                break
            values.append(value)
        else:
            groups.setdefault(tuple(values), []).append(v)
    yield from groups.items()
