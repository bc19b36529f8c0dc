"""The neuron plugin, scheduler side: whole Neuron devices and NeuronCores on rings and 4x4 tori.

A container asks for whole devices (`aws.amazon.com/neuron`, or its newer name `aws.amazon.com/neurondevice`:
both count the same devices) or for NeuronCores (`aws.amazon.com/neuroncore`), never both at once.

Where a node's devices are and how they are linked:

* the advertised inventory `node.inventories["neuron"]` when there is one: its integer device ids (others are
  ignored), `healthy` (unhealthy devices and their cores are never allocated), `cores` (the first device that
  says; else the catalog's value for the instance type; else 1), `topology` (`{"kind": "ring"}` or
  `{"kind": "torus", "rows": 4, "columns": 4}`; else the catalog's) and attribute `instanceType`;
* otherwise the `node.kubernetes.io/instance-type` label (or `beta.kubernetes.io/instance-type`) looked up in
  the catalog in `topology.py`;
* otherwise, for an unknown type with `aws.amazon.com/neuron` (or `neurondevice`) allocatable N: a ring of N
  devices with allocatable `neuroncore` // N cores each, or 1 when the node advertises no cores. A guess, but
  the safe one: a ring only ever hands out contiguous ids.

Which sets are valid and which one is chosen (least fragmentation) is explained in `topology.py`. A refusal is
unresolvable when the node could not take the pod even if it were empty (too many devices, an unsupported
count, unhealthy devices in the way) and unschedulable when devices in use are in the way. The allocation
lists device or core ids under the resource name the container asked for; `fields` carries `coresPerDevice`
and `instanceType`, from which the node side derives `AWS_NEURON_VISIBLE_DEVICES`, `NEURON_RT_VISIBLE_CORES`
and `/dev/neuronN` (core c is on device c // coresPerDevice). `take` checks that every id names a healthy,
free device or core, but not the shape, so a pod placed under an older rule is still accounted for after a
restart.

Score: the mean over the pod's Neuron containers of 100 * request / host, where host is the size of the
largest free valid set the placement breaks into (whole devices) or the length of the free core run it is cut
from (cores). Consuming a free set exactly scores 100; one device out of a free 16-device torus scores 6.25.
A multi-device request of a size a torus also takes (4 or 8 on trn1) scores half on a ring: rings are the only
home of the other sizes (2, 3, 5, ...), so those requests go to tori first and leave rings' runs for sizes only a
ring can take (`TORUS_SHARED_SIZES`). The score then shrinks by 5 x the chance the placement adds that the node
turns away the next whole-device request of the mix the engine learned (`_turned_away`).

Fragmentation (`kubegpu_scheduler_fragmentation`): the kit's measure (`kubegpu.core.kit.fragmentation_growth`) over
the node's free devices, a size fitting where one of its valid sets is free (`topology.has_free_set`); the mix is
the whole-device containers the engine's neuron states took (core requests are not in it, but the devices their
cores touch stop being free). `kubegpu_scheduler_fragmentation_epoch` is that mix's version: the engine measures a
node again once the mix moved, not only once the node changed.

The books are the plugin kit's (`kubegpu.core.kit.PartedDeviceNodeState`: devices made of cores, each held whole
or core by core): a device is free for whole-device requests only when none of its cores is held, and a device held
whole offers no cores; the kit's `DevicePlugin` takes, releases, describes and measures headroom over them. The plan
for a request is cached per state version, so fit, score and allocate of one pod on one node compute it once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kubegpu.core.annotations import init_devices
from kubegpu.core.kit import MIX_DRIFT, MIX_KEY, TURNED_AWAY_WEIGHT, Claim, DevicePlugin, PartedDeviceNodeState, SizeMix
from kubegpu.core.limits import check_device_count
from kubegpu.core.models import InitStep, NodeInfo, PluginAllocation, PodRequest
from kubegpu.core.scheduler_hooks import hookimpl
from kubegpu.core.status import Code, Status
from kubegpu.plugins.neuron import NAME, NEURON, NEURONCORE, NEURONDEVICE, RESOURCES
from kubegpu.plugins.neuron import topology as topo
from kubegpu.plugins.neuron.topology import Topology

# Seed 000's flow (the Neuron scheduler extension with the stock Neuron device plugin): the extension writes the whole
# devices it chose as the pod annotation NEURON_DEVS (`2,3`), and the cores it chose as NEURON_CORES (`2,3`), which the
# device plugin reads at Allocate and exports as AWS_NEURON_VISIBLE_DEVICES / NEURON_RT_VISIBLE_CORES. kubegpu writes
# them too, so extender-mode users can keep that device plugin.
DEVICES_ANNOTATION = "NEURON_DEVS"
CORES_ANNOTATION = "NEURON_CORES"

INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
# Multi-device sizes a 4x4 torus takes too: on a ring they score RING_SHARE of their fit (module docstring).
TORUS_SHARED_SIZES = frozenset(size for size in topo.valid_sizes(topo.make_topology("torus", 16, 4, 4)) if size > 1)
RING_SHARE = 0.5
# The topology score of a placement shrinks by this much per unit of turned-away chance it adds (`_turned_away`):
# a placement that turns away a fifth of the learned mix scores 0 (measured on placement_bench's departures mixes).
TURNED_AWAY_DISCOUNT = 5.0

# (container name, resource name, amount, role) for every container asking for Neuron resources, in the order of
# `PodRequest.containers`. `role` is HOLDER for the classic init container that holds what its step needs beyond the
# app containers' and sidecars' (`ContainerRequest.init`), BESIDE for a sidecar started before that init container
# (it keeps its own devices while the init container runs), else "" (`place`).
Requests = tuple[tuple[str, str, int, str], ...]
HOLDER, BESIDE = "holder", "beside"
# (init container, resource, amount, sidecars started before it) for every classic init container asking for Neuron
# resources, in order: what the kubelet gives each of its pod's devices (`_steps_given`) must be a valid set too.
Steps = tuple[tuple[str, str, int, tuple[str, ...]], ...]
# A pod's Neuron requests, the refusal of a container that mixes resources, and its init containers' steps:
# `kubegpu_scheduler_prepare`'s answer.
NeuronPodState = tuple[Requests, Status | None, Steps]


# ------------------------------------------------------------------------------------------------------------
# Private state
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NeuronPlacement:
    """The placement of one pod's Neuron containers: (container, resource, ids) in order, and its score."""

    status: Status
    placements: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    score: float = 0.0


class NeuronNodeState(PartedDeviceNodeState):
    """One node's Neuron devices on the kit's books (`kubegpu.core.kit.PartedDeviceNodeState`): device d is bit d
    of `free_devices` (the kit's `free`), core c is bit c of `free_cores` (the kit's `free_parts`), on device
    c // `cores_per_device`.

    Invariants kept by the kit's take and release: a device is free iff it is healthy, held by nobody whole and
    has no held core; a core is free iff its device is healthy and not held whole, and the core is not held.
    `version` grows on every change (it keys the plan cache).
    """

    plugin = NAME
    part_noun = "core"

    def __init__(
        self,
        node: str,
        topology: Topology,
        cores_per_device: int,
        instance_type: str,
        present: int,
        healthy: int,
        mix: SizeMix | None = None,
    ) -> None:
        count = present.bit_length()
        flags = [bool(healthy >> d & 1) for d in range(count)]
        super().__init__(NAME, node, [str(d) for d in range(count)], flags, cores_per_device, present, topology, mix)
        self.topology = topology
        self.cores_per_device = cores_per_device
        self.instance_type = instance_type
        self.healthy_cores = self.healthy_parts
        self.healthy_device_count = self.healthy.bit_count()
        self.healthy_core_count = self.healthy_cores.bit_count()
        self._plan_key: tuple[int, Requests, Steps] | None = None
        self._plan: NeuronPlacement | None = None
        self._turned_away: tuple[object, float] = (None, 0.0)

    # The books by the names the placement rules read.
    @property
    def free_devices(self) -> int:
        return self.free

    @free_devices.setter
    def free_devices(self, value: int) -> None:
        self.free = value

    @property
    def free_cores(self) -> int:
        return self.free_parts

    def scoring_content(self) -> tuple[object, ...]:
        """What the engine's local scores read of this state (`Scoring.scoring_content`), so that nodes alike share
        one computation of their scores: `place` (score and fit) reads the topology, the cores per device, the
        healthy and free devices and cores; `_turned_away` and the fragmentation measure read the free devices and
        the learned mix, whose version stands for it (the mix is the engine's one per plugin, and its `version`
        grows with every publication). The instance type and `present` only name things in refusals, which score
        0 alike. Not remembered: a tuple of a few ints, and the engine keeps it per node version. A change to
        `place` or `_turned_away` that reads more of the state must add it here (tests/plugins/test_neuron.py's
        `test_nodes_alike_in_scoring_content_score_alike`)."""
        return (
            self.topology,
            self.cores_per_device,
            self.healthy,
            self.free,
            self.free_parts,
            self.mix.version,
        )


# ------------------------------------------------------------------------------------------------------------
# Hook implementations
# ------------------------------------------------------------------------------------------------------------


class NeuronPlugin(DevicePlugin[NeuronNodeState]):
    """The neuron plugin on the kit: the kit keeps the books of devices and their cores (take, release, headroom,
    describe over `PartedDeviceNodeState`); this class reads a node's shape and a pod's requests, places them
    (`place`) and reads an allocation back into a `Claim` of devices and cores."""

    name = NAME
    resources = tuple(RESOURCES)
    family = NAME

    # -- the books: what the kit's hooks ask ---------------------------------------------------------------------

    def claimed(self, state: NeuronNodeState, allocation: PluginAllocation) -> Claim | str:
        parsed = _parse_allocation(allocation)
        if isinstance(parsed, str):
            return parsed
        devices, cores = parsed
        return Claim(devices, parts=cores)

    def learn(self, state: NeuronNodeState, allocation: PluginAllocation, pod: PodRequest | None, claim: Claim) -> None:
        """The mix of whole-device sizes the measure expects: core requests are not in it."""
        containers = allocation.containers
        if len(containers) == 1:  # the claim's whole devices are its one container's
            state.mix.add(len(claim.whole))
            return
        for resources in containers.values():
            state.mix.add(sum(len(ids) for resource, ids in resources.items() if resource != NEURONCORE))

    def headroom_free(self, state: NeuronNodeState) -> dict[str, int]:
        devices = topo.largest_device_set(state.topology, state.free)
        cores = topo.largest_core_request(state.topology, state.cores_per_device, state.free_parts)
        return {NEURON: devices, NEURONDEVICE: devices, NEURONCORE: cores}

    def largest(self, state: NeuronNodeState, free: int) -> int:
        return topo.largest_device_set(state.topology, free)

    def picture(self, state: NeuronNodeState) -> dict[str, object]:
        """A torus as a grid of its rows, a ring as one row; links between the present devices."""
        grid = state.topology.kind == "torus"
        position = {device: i for i, device in enumerate(topo.bit_ids(state.present))}
        links = [(position[a], position[b]) for a, b in topo.links(state.topology) if a in position and b in position]
        return {
            "layout": "grid" if grid else "ring",
            "columns": state.topology.columns if grid else state.topology.devices,
            "topology": state.topology.kind,
            "links": links,
        }

    # -- deciding: the pod's requests, their placement -----------------------------------------------------------

    @hookimpl
    def kubegpu_scheduler_build_node(self, node: NodeInfo, shared: dict[str, object] | None) -> NeuronNodeState | None:
        shape = node_shape(node)
        if shape is None:
            return None
        topology, cores_per_device, instance_type, present, healthy = shape
        mix = shared.get(MIX_KEY) if shared is not None else None
        if shared is not None and not isinstance(mix, SizeMix):
            mix = shared[MIX_KEY] = SizeMix(drift=MIX_DRIFT)
        mix = mix if isinstance(mix, SizeMix) else None
        return NeuronNodeState(node.name, topology, cores_per_device, instance_type, present, healthy, mix)

    @hookimpl
    def kubegpu_scheduler_validate(self, pod: PodRequest) -> Status | None:
        return neuron_requests(pod)[1]

    @hookimpl
    def kubegpu_scheduler_prepare(self, pod: PodRequest) -> NeuronPodState:
        return neuron_requests(pod)

    @hookimpl
    def kubegpu_scheduler_fit(self, state: NeuronNodeState, pod: PodRequest, prepared: NeuronPodState) -> Status:
        return _plan(state, prepared).status

    @hookimpl
    def kubegpu_scheduler_score(self, state: NeuronNodeState, pod: PodRequest, prepared: NeuronPodState) -> float:
        plan = _plan(state, prepared)
        if not plan.status.ok:
            return 0.0
        return plan.score * max(0.0, 1.0 - TURNED_AWAY_DISCOUNT * _turned_away(state, plan))

    @hookimpl
    def kubegpu_scheduler_fragmentation(
        self, state: NeuronNodeState, pod: PodRequest, prepared: NeuronPodState | None, free: Mapping[str, int]
    ) -> float | None:
        if not state.mix.total or prepared is None:
            return None
        plan = _plan(state, prepared)
        if not plan.status.ok or not plan.placements:
            return None
        return _turned_away(state, plan) * TURNED_AWAY_WEIGHT * state.mix.mean()

    @hookimpl
    def kubegpu_scheduler_fragmentation_epoch(self, shared: dict[str, object]) -> int | None:
        """The version of the engine's learned mix of whole-device sizes: `fragmentation` and `score` move with it."""
        mix = shared.get(MIX_KEY)
        return mix.version if isinstance(mix, SizeMix) else None

    @hookimpl
    def kubegpu_scheduler_allocate(
        self, state: NeuronNodeState, pod: PodRequest, prepared: NeuronPodState
    ) -> PluginAllocation | None:
        plan = _plan(state, prepared)
        if not plan.status.ok:
            return None
        containers: dict[str, dict[str, list[str]]] = {}
        chosen: dict[str, set[int]] = {DEVICES_ANNOTATION: set(), CORES_ANNOTATION: set()}
        for container, resource, ids in plan.placements:
            containers.setdefault(container, {})[resource] = [str(i) for i in ids]
            chosen[CORES_ANNOTATION if resource == NEURONCORE else DEVICES_ANNOTATION].update(ids)
        return PluginAllocation(
            plugin=NAME,
            containers=containers,
            fields={"coresPerDevice": state.cores_per_device, "instanceType": state.instance_type},
            annotations={key: ",".join(str(i) for i in sorted(ids)) for key, ids in chosen.items() if ids},
        )


# ------------------------------------------------------------------------------------------------------------
# Pure helpers
# ------------------------------------------------------------------------------------------------------------


def node_shape(node: NodeInfo) -> tuple[Topology, int, str, int, int] | None:
    """(topology, cores per device, instance type, present devices, healthy devices) of a node, or None."""
    instance_type = next((node.labels[key] for key in INSTANCE_TYPE_LABELS if node.labels.get(key)), "")
    catalog = topo.CATALOG.get(instance_type)
    inventory = node.inventories.get(NAME)
    if inventory is not None:
        devices = [d for d in inventory.devices if d.id.isascii() and d.id.isdigit()]
        if devices:
            instance_type = str(inventory.attributes.get("instanceType") or instance_type)
            catalog = topo.CATALOG.get(instance_type, catalog)
            highest = max(int(d.id) for d in devices)
            check_device_count(node.name, f"Neuron devices (highest advertised id {highest})", highest + 1)
            present = sum(1 << int(d.id) for d in devices)
            healthy = sum(1 << int(d.id) for d in devices if d.healthy)
            cores = next((d.cores for d in devices if d.cores), None) or (catalog.cores_per_device if catalog else 1)
            kind = str(inventory.topology.get("kind") or (catalog.kind if catalog else "ring"))
            rows = _int(inventory.topology.get("rows"), catalog.rows if catalog else 0)
            columns = _int(inventory.topology.get("columns"), catalog.columns if catalog else 0)
            count = max(present.bit_length(), rows * columns if kind == "torus" else 0)
            return topo.make_topology(kind, count, rows, columns), cores, instance_type, present, healthy
    if catalog is not None:
        every = (1 << catalog.devices) - 1
        shape = topo.make_topology(catalog.kind, catalog.devices, catalog.rows, catalog.columns)
        return shape, catalog.cores_per_device, instance_type, every, every
    count = max(node.allocatable.get(NEURON, 0), node.allocatable.get(NEURONDEVICE, 0))
    if count <= 0:
        return None
    check_device_count(node.name, "Neuron devices in allocatable", count)
    cores = max(node.allocatable.get(NEURONCORE, 0) // count, 1)
    every = (1 << count) - 1
    return topo.make_topology("ring", count), cores, instance_type, every, every


def _turned_away(state: NeuronNodeState, plan: NeuronPlacement) -> float:
    """How much more likely the plan makes the node turn away the next whole-device container of the learned mix
    (`kubegpu.core.kit.turned_away_growth`); kept per (state version, plan, mix version)."""
    key = (state.version, plan, state.mix.version)
    if state._turned_away[0] == key:
        return state._turned_away[1]
    k = state.cores_per_device
    after = state.free
    for _, resource, ids in plan.placements:
        for i in ids:
            after &= ~(1 << (i // k if resource == NEURONCORE else i))
    # `kubegpu.core.kit.turned_away_growth` with the fitting sizes of both as masks (one cached lookup each).
    lost = topo.fitting_sizes(state.topology, state.free) & ~topo.fitting_sizes(state.topology, after)
    grown = math.fsum(p for size, p in state.mix.mix() if lost >> size & 1) if lost else 0.0
    state._turned_away = (key, grown)
    return grown


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def neuron_requests(pod: PodRequest) -> NeuronPodState:
    """The pod's Neuron requests in container order, or the refusal of a container that mixes resources (read once
    per pod signature: `kubegpu_scheduler_prepare`)."""
    return _neuron_requests(pod)


def _neuron_requests(pod: PodRequest) -> NeuronPodState:
    steps = {step.name: step.sidecars for step in pod.init_steps}
    asked = tuple(
        (step.name, resource, amount, step.sidecars)
        for step in pod.init_steps
        for resource, amount in step.resources.items()
        if resource in RESOURCES and amount > 0
    )
    # resource -> the sidecars started before the init container holding more of it than the other containers.
    beside = {r: steps.get(c.name, ()) for c in pod.containers if c.init for r in _amounts(c.resources)}
    found = []
    for container in pod.containers:
        amounts = _amounts(container.resources)
        if not amounts:
            continue
        if amounts.keys() >= {NEURON, NEURONDEVICE}:
            return (
                (),
                Status.unresolvable(
                    f"container {container.name} requests both {NEURON} and {NEURONDEVICE}, which count the same "
                    "whole Neuron devices; request only one of them",
                    plugin=NAME,
                ),
                (),
            )
        if NEURONCORE in amounts and len(amounts) > 1:
            device_resource = next(r for r in amounts if r != NEURONCORE)
            return (
                (),
                Status.unresolvable(
                    f"container {container.name} requests whole Neuron devices ({device_resource}) and "
                    f"NeuronCores ({NEURONCORE}) together; "
                    "request either whole devices or cores in one container",
                    plugin=NAME,
                ),
                (),
            )
        ((resource, amount),) = amounts.items()
        role = HOLDER if container.init else BESIDE if container.name in beside.get(resource, ()) else ""
        found.append((container.name, resource, amount, role))
    return tuple(found), None, asked


def _amounts(resources: Mapping[str, int]) -> dict[str, int]:
    return {r: resources[r] for r in RESOURCES if resources.get(r, 0) > 0}


def _plan(state: NeuronNodeState, asked: NeuronPodState) -> NeuronPlacement:
    requests, refusal, steps = asked
    if refusal is not None:
        return NeuronPlacement(refusal)
    key = (state.version, requests, steps)
    if state._plan_key == key and state._plan is not None:
        return state._plan
    plan = place(state, requests, state.free, state.free_parts, steps=steps)
    if plan.status.code is Code.UNSCHEDULABLE:
        # Would the pod fit this node if nothing else ran on it? If not, waiting will not help.
        empty = place(state, requests, state.healthy, state.healthy_cores, empty_node=True, steps=steps)
        if not empty.status.ok:
            plan = NeuronPlacement(Status.unresolvable(*empty.status.reasons, plugin=NAME))
    state._plan_key, state._plan = key, plan
    return plan


def place(
    state: NeuronNodeState,
    requests: Requests,
    free_devices: int,
    free_cores: int,
    *,
    empty_node: bool = False,
    steps: Steps = (),
) -> NeuronPlacement:
    """Place the containers' requests one after the other on the given free devices and cores.

    A resource that a classic init container holds more of than the app containers and sidecars (its HOLDER entry)
    is placed as one valid set of the init container's count, then split: the app containers' and the later sidecars'
    sets carved from its low end, each valid, and the holder given the rest. The kubelet gives the init container its
    pod's devices but those of the sidecars started before it (BESIDE: placed on their own), the app containers'
    first (`kubegpu.core.annotations.init_devices`), so what it runs on is that one valid set, as if it had asked
    alone; placed one by one, the holder's difference (3 beside an app's 1 under a check of 4) was refused on a torus
    as a count nobody asked, and on a ring landed away from the app's.

    Every init container (`steps`) runs on what the kubelet gives it, which must be a valid set of its own count as
    well: a count no container may ask is refused as such, and a placement where an init container asking less than
    its pod holds would be given ids that are no valid set (an app's 1 device and the first 2 of another's 4 apart)
    is refused, naming it (`_steps_given`); before, it was placed and the init container ran on them."""
    t, k = state.topology, state.cores_per_device
    placed: dict[int, tuple[str, str, tuple[int, ...]]] = {}
    score = 0.0
    for index, (container, resource, _, _) in enumerate(requests):
        if index in placed:
            continue
        group = _init_group(requests, index)
        count = sum(requests[i][2] for i in group)
        cores = resource == NEURONCORE
        total = state.healthy_core_count if cores else state.healthy_device_count
        if count > total:
            return NeuronPlacement(Status.unresolvable(f"Insufficient {resource}", plugin=NAME))
        if cores and not topo.core_request_supported(t, k, count):
            return NeuronPlacement(Status.unresolvable(_unsupported_cores(state, count), plugin=NAME))
        if not cores and count not in topo.valid_sizes(t):
            return NeuronPlacement(Status.unresolvable(_unsupported_devices(state, count), plugin=NAME))
        if cores:
            chosen = topo.choose_cores(t, k, free_devices, free_cores, count)
        else:
            chosen = topo.choose_devices(t, k, free_devices, free_cores, count)
        code = Status.unresolvable if empty_node else Status.unschedulable
        if chosen is None:
            available = (free_cores if cores else free_devices).bit_count()
            reason = f"Insufficient {resource}" if available < count else _no_set(state, cores, count, empty_node)
            return NeuronPlacement(code(reason, plugin=NAME))
        carved: dict[int, int] = {}
        if len(group) > 1:
            # The app containers' sets must fit in the init container's: the least fragmenting set first, else the
            # lowest that takes them, so that a refusal is true of every free set of the count.
            asks = [(i, requests[i][2]) for i in group if requests[i][3] != HOLDER]
            free = free_cores if cores else free_devices
            for candidate in (chosen, *_valid_sets(state, cores, free, count)):
                found = _carve(state, cores, candidate, asks)
                if found is not None:
                    chosen, carved = candidate, found
                    break
            else:
                holder = next(requests[i][0] for i in group if requests[i][3] == HOLDER)
                sizes = ", ".join(str(size) for _, size in asks)
                reason = (
                    f"init container {holder} is given its pod's {count} {resource}, which must be one valid set, "
                    f"and no{'' if empty_node else ' free'} valid set of {count} holds valid sets of {sizes} for the "
                    "other containers; change their counts"
                )
                return NeuronPlacement(code(reason, plugin=NAME))
        start = (chosen & -chosen).bit_length() - 1
        if cores:
            fit = count / topo.core_host(free_cores, start)
            free_cores &= ~chosen
            free_devices &= ~topo.devices_of_cores(chosen, k)
        else:
            fit = count / topo.device_host(t, free_devices, start)
            fit = fit * RING_SHARE if t.kind == "ring" and count in TORUS_SHARED_SIZES else fit
            free_devices &= ~chosen
            free_cores &= ~topo.cores_of_devices(chosen, k)
        score += fit * len(group)
        if len(group) == 1:
            placed[index] = (container, resource, tuple(topo.bit_ids(chosen)))
            continue
        rest = chosen
        for i, mask in carved.items():
            placed[i] = (requests[i][0], resource, tuple(topo.bit_ids(mask)))
            rest &= ~mask
        for i in group:
            if requests[i][3] == HOLDER:
                placed[i] = (requests[i][0], resource, tuple(topo.bit_ids(rest)))
    for name, resource, count, _ in steps:
        if resource == NEURONCORE and not topo.core_request_supported(t, k, count):
            return NeuronPlacement(
                Status.unresolvable(f"init container {name}: {_unsupported_cores(state, count)}", plugin=NAME)
            )
        if resource != NEURONCORE and count not in topo.valid_sizes(t):
            return NeuronPlacement(
                Status.unresolvable(f"init container {name}: {_unsupported_devices(state, count)}", plugin=NAME)
            )
    placements = tuple(placed[i] for i in range(len(requests)))
    problem = _steps_given(state, steps, placements)
    if problem is not None:
        return NeuronPlacement((Status.unresolvable if empty_node else Status.unschedulable)(problem, plugin=NAME))
    mean = 100.0 * score / len(requests) if requests else 100.0
    return NeuronPlacement(Status.success(), placements, mean)


def _steps_given(
    state: NeuronNodeState, steps: Steps, placements: tuple[tuple[str, str, tuple[int, ...]], ...]
) -> str | None:
    """Why an init container would run on ids that are no valid set of its count, as the kubelet gives them of the
    placed pod's (`kubegpu.core.annotations.init_devices`: those of the init containers before it, then the app
    containers' and sidecars' in order); None when each is given a valid set."""
    if not steps:
        return None
    containers: dict[str, dict[str, list[str]]] = {}
    for container, resource, ids in placements:
        containers.setdefault(container, {})[resource] = [str(i) for i in ids]
    merged: dict[str, tuple[dict[str, int], tuple[str, ...]]] = {}
    for name, resource, count, sidecars in steps:
        merged.setdefault(name, ({}, sidecars))[0][resource] = count
    given, _ = init_devices(containers, {}, tuple(InitStep(n, r, c) for n, (r, c) in merged.items()))
    for name, resource, count, _ in steps:
        numbers = [int(i) for i in given.get(name, {}).get(resource, [])]
        mask = sum(1 << i for i in numbers)
        if len(numbers) != count or count == 1:
            continue
        if mask in (
            _valid_sets(state, True, mask, count) if resource == NEURONCORE else topo.valid_sets(state.topology, count)
        ):
            continue
        shown = ",".join(str(i) for i in numbers)
        return (
            f"init container {name} would be given {resource} {shown} of its pod's (the kubelet gives it those of the "
            "init containers before it, then the other containers' in order), which are no valid set of "
            f"{count}; change its count: as many as its pod's first container asks, or more than its other "
            "containers hold together"
        )
    return None


def _init_group(requests: Requests, index: int) -> tuple[int, ...]:
    """The requests placed together with request `index`: every request of its resource but the BESIDE sidecars' when
    an init container holds some of it (`place`), else itself alone."""
    resource, role = requests[index][1], requests[index][3]
    same = tuple(i for i, request in enumerate(requests) if request[1] == resource and request[3] != BESIDE)
    return same if role != BESIDE and any(requests[i][3] == HOLDER for i in same) else (index,)


def _carve(state: NeuronNodeState, cores: bool, within: int, asks: list[tuple[int, int]]) -> dict[int, int] | None:
    """Valid sets of the asked sizes inside `within` (request index -> mask), each at the lowest valid position
    left: in the containers' order where they all fit so (the kubelet gives an init container asking less than the
    holder the containers' ids in that order, `_steps_given`: on a ring that prefix is contiguous), else largest
    first; None when one does not fit. Largest first, aligned torus blocks and ring windows always fit in a set as
    large as their sum; core windows on a torus may not."""
    for order in (asks, sorted(asks, key=lambda ask: -ask[1])):
        left = within
        carved: dict[int, int] = {}
        for index, count in order:
            mask = next(iter(_valid_sets(state, cores, left, count)), None)
            if mask is None:
                break
            carved[index] = mask
            left &= ~mask
        else:
            return dict(sorted(carved.items()))
    return None


def _valid_sets(state: NeuronNodeState, cores: bool, free: int, count: int) -> list[int]:
    """Every valid set of `count` cores (or devices) within `free`, lowest first: at most 32 windows, or a
    topology's sets of one size."""
    t, k = state.topology, state.cores_per_device
    if not cores:
        return [block for block in topo.valid_sets(t, count) if free & block == block]
    allowed = 0
    for _, first_cores in topo.core_groups(t, k, count):
        allowed |= first_cores
    return [topo.interval(start, count) for start in topo.bit_ids(topo.window_starts(free, count) & allowed)]


def _unsupported_devices(state: NeuronNodeState, count: int) -> str:
    instance_type = state.instance_type or "of this node"
    return (
        f"Instance type {instance_type} does not support requests for device: {count}. "
        "Please request a different number of devices."
    )


def _unsupported_cores(state: NeuronNodeState, count: int) -> str:
    ranges = [
        f"{lo}-{hi}" if hi > lo else str(lo)
        for lo, hi in topo.core_request_ranges(state.topology, state.cores_per_device)
    ]
    choices = ranges[0] if len(ranges) == 1 else ", ".join(ranges[:-1]) + " or " + ranges[-1]
    return (
        f"Instance type {state.instance_type or 'of this node'} does not support requests for core: {count}. "
        f"Please request a different number of cores ({choices} cores fill a valid set of devices)."
    )


def _no_set(state: NeuronNodeState, cores: bool, count: int, empty_node: bool) -> str:
    """`no free contiguous set of 4 Neuron devices`; on an empty node `no contiguous set of 4 healthy ...`."""
    free, healthy = ("", " healthy") if empty_node else (" free", "")
    if cores:
        where = "" if state.topology.kind == "ring" else " on a valid set of Neuron devices"
        return f"no{free} contiguous run of {count}{healthy} NeuronCores{where}"
    if count == 1:
        return f"no{free}{healthy} Neuron device"
    shape = "contiguous set" if state.topology.kind == "ring" else "aligned torus block"
    return f"no{free} {shape} of {count}{healthy} Neuron devices"


def _parse_allocation(allocation: PluginAllocation) -> tuple[list[int], list[int]] | str:
    """The whole devices and the cores an allocation names, or why not, naming the first bad entry."""
    devices: list[int] = []
    cores: list[int] = []
    for resources in allocation.containers.values():
        for resource, ids in resources.items():
            if resource not in RESOURCES:
                return f"resource {resource} is not a Neuron resource"
            target, what = (cores, "core") if resource == NEURONCORE else (devices, "device")
            for raw in ids:
                if not (raw.isascii() and raw.isdigit()):
                    return f"{what} id {raw!r} is not a Neuron {what} number"
                target.append(int(raw))
    for numbers, what in ((devices, "device"), (cores, "core")):
        if len(set(numbers)) != len(numbers):
            twice = next(i for i in numbers if numbers.count(i) > 1)
            return f"{what} {twice} is listed twice in the allocation"
    return devices, cores


# ------------------------------------------------------------------------------------------------------------
# Factory
# ------------------------------------------------------------------------------------------------------------

# What the entry point names (`kubegpu.plugins.neuron.scheduler:plugin`), as a pip-installed plugin's.
plugin = NeuronPlugin()
