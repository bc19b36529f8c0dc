"""`kubegpu device-plugin`: the node side as a Kubernetes device plugin, for nodes whose kubelet talks to the runtime
directly (managed nodes, where the runtime endpoint cannot be pointed at the CRI shim).

One process serves the device plugin API `v1beta1` (`protos.py`) for every resource of every installed Device
plugin that names device ids for it (`kubegpu_device_plugin_ids`): one socket per resource under the kubelet's
`device-plugins/` directory, registered with the kubelet's `Registration` service.

* **ListAndWatch** streams the resource's ids with their health, from the plugins' discovery and health checks under
  `--host-root`, repeated every `--interval`; a change is sent at once. The ids are the ones the scheduler allocates
  (Neuron device or core numbers, Intel card names, NVIDIA GPU indexes), so the kubelet's accounting and kubegpu's
  speak of the same devices. A device several containers share is listed once per share slot instead (`0::3`,
  `core.models.slot_id`: an NVIDIA GPU on a node configured for shares, split `KUBEGPU_NVIDIA_SPLIT_COUNT` ways, as
  HAMi's device plugin counts it), so that the kubelet admits as many share pods per device as the scheduler places.
* **Share slots** are read back as their devices before anything else (`shared_devices`): GetPreferredAllocation
  answers one free slot of each device the allocation names (the lowest), Allocate matches the slots' devices as it
  matches device ids and answers the allocation's devices and shares (the GPU share limits of
  `plugins/nvidia/limits.py`, as in the shim). Two slots of one device for one container, or slots mixed with
  device ids, are refused (`shares`): the scheduler gives a container at most one share of each device.
* **MIG devices** (`nvidia.com/mig-<profile>`, ids `GPU@start`) are served only where the node sets
  `KUBEGPU_NVIDIA_SERVE_MIG=true` (else NVIDIA's device plugin serves them), and matched like any device ids.
* **GetPreferredAllocation** answers the ids the scheduler signed for the pod being admitted, so the kubelet, which
  takes preferred ids first, allocates exactly the scheduler's choice.
* **Allocate** looks the requested ids up among the verified allocations (signature, node, pod UID:
  `verify.verified_allocation`) of the pods bound to this node that have not started: the ids must be exactly one
  container's ids for that resource. It answers what the CRI shim would apply (the owning plugin's
  `kubegpu_device_edit_container` on an empty container: device specs from `--dev-root`, env, mounts, annotations,
  CDI names). Ids that no verified allocation names are refused (the kubelet fails the pod's admission with the
  message): a device plugin cannot leave a container without devices it was counted for, so the only safe answer
  to an unsigned or foreign request is no container at all.
* **Pods gone**: at every interval, the UIDs of the pods the API server lists on the node go to every plugin
  (`kubegpu_device_forget_pods`), which removes what it keeps on the host for the others (HAMi-core's region
  directories); one lock spans that listing and the plugins' answers, and each Allocate's edit.
* Re-registration: the kubelet removes every socket in its `device-plugins/` directory when it starts, and creates
  a new `kubelet.sock`. The process checks once a second whether its sockets are still there and whether
  `kubelet.sock` is a new file; if not, it serves on fresh sockets and registers again.

Which pod is being admitted: the kubelet's device manager does not say. It admits pods one at a time, in the order
they reach it (a batch, such as the pods found at its start, in creation order), and allocates each container's
devices in turn (init containers, then containers): GetPreferredAllocation gets the available ids and a count,
Allocate gets the ids. Both are matched against the pods on this node (one LIST of the API server's pods with
`spec.nodeName` = this node, made at GetPreferredAllocation, and again at Allocate when its ids name no known
allocation) that are bound, not running or finished, not being deleted, and request some resource: those with a
verified allocation and those without (kubegpu did not place them, or their allocation failed a check). For each
such pod, the container it would be allocated next is the first one requesting the resource that this process has
not answered for; a pod is a possible match for a call when that container asks exactly the call's count.

* Init containers: a classic init container's ids are the ones the allocation's `init` names for it (every one of
  them its pod's: `core.annotations.init_devices`). The kubelet gives the containers after it the init containers'
  devices first, at its own pick among them, and asks the plugin only for the rest (`must_include` the ones it
  kept): such a container may be allocated any of its pod's ids, once an init container of the pod was.
* GetPreferredAllocation answers the signed ids of the first possible match, in creation order (then the
  scheduler's `issued` stamp), whose ids are all available (for a container after an init container, the ids the
  kubelet kept, then its own and its pod's free ones); nothing when a possible match has no verified allocation of
  the resource: the kubelet must never be steered onto a placed pod's devices for a pod that may be another.
* Allocate is answered from the possible match whose verified ids are exactly the requested ones (or, for a
  container after an allocated init container, all ids its pod's), and only when no possible match lacks a
  verified allocation. Otherwise the call is refused (`missing`: no allocation names these ids;
  `ambiguous`: a pod kubegpu did not place asks the same count and may be the one admitted), and the kubelet fails
  the pod's admission with the message. A pod without a verified allocation never gets anything of kubegpu's.
* Settling: the kubelet writes a pod it refused as Failed a moment after refusing it, and may already be admitting
  the next. While both a placed pod and one kubegpu did not place are possible matches, both calls list the pods
  again every 0.2 s for up to 2 s, so that the placed pod admitted right after a refused one gets its devices.

Races, and what happens:

* A pod kubegpu did not place pending at the same time as a placed pod with the same count, the first still
  pending after the settling time (its admission is the call being answered, or it reached the kubelet later):
  the call is refused, whichever pod it is for; the placed pod fails admission if the call was its own (its
  controller, if any, creates it again). Never a device of the placed pod's for the other.
* Two placed pods on one node pending at once, asking the same count of the same resource, admitted by the kubelet
  in the other order (a pod bound later but created earlier, and both waiting for the kubelet): each gets the
  other's signed devices. Both sets were signed for this node, Allocate hands each container exactly the ids the
  kubelet recorded, and no device is given twice, but the scheduler's record names the other pod; nothing in the
  device plugin API tells the two apart. The PodResources publication (`podresources.py`) makes the ledger count
  what the kubelet really allocated.
* The pod's allocation is not yet visible (the kubelet saw the binding first): GetPreferredAllocation lists pods
  again; if it still finds nothing it answers no preference, the kubelet picks ids itself, and Allocate refuses them
  unless they happen to be the scheduler's.
* A pod whose preferred ids are no longer all available (a device went unhealthy, or the kubelet still counts a
  finished pod's devices): no preference, and Allocate refuses ids the scheduler did not sign.

What the mode cannot do: the env a tenant writes in a container (`NVIDIA_VISIBLE_DEVICES=all` in the pod spec, an
`envFrom`, or the image's own `ENV`) reaches the runtime untouched; a device plugin only adds to a container, and
the kubelet passes the container's own `envFrom` and `env` after Allocate's env, so they win. The CRI shim removes
it (T8 in docs/security.md). Here, for a container being allocated devices, Allocate refuses (`env`, naming it:
`refuse_overriding_env`, T210) an `env` entry naming a variable the owning plugin owns or its answer sets to another
value, and an `envFrom` whose prefix could make one; the answer is computed from the container's own literal env, as
the shim's is, so `ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE` gets an Intel tile mask written in COMPOSITE. A container
asking no device never reaches a device plugin: there the cluster must refuse it, `examples/deploy/admission/` and
docs/security.md (T22) say how. (The image's `ENV` ranks below Allocate's env, which for a GPU share names every
variable HAMi-core reads that could lift it: T133.) Nor can it remove the pod's volumes, which the kubelet mounts
after the device plugin's mounts, on top of them: a container that mounts one at or under a path the owning plugin
owns or its answer mounts (`/overrideEnv`, `/etc/ld.so.preload`, HAMi-core's region directory) is refused (`mount`,
naming it: `refuse_owned_mounts`, T135).

Pods kubegpu did not place (bound by another scheduler, or with `spec.nodeName` written by hand) are refused by
default, as above. With `--foreign-pods allow`, Allocate grants such a pod the ids the kubelet chose (the kubelet
still never hands one id to two pods; GetPreferredAllocation states no preference for them; an `ambiguous` call is
answered this way too, whichever pod it is for), and answers what the
owning plugin applies for those ids without any allocation fields (whole devices: device nodes and env; NeuronCores,
which need the scheduler's `coresPerDevice`, are still refused). Share slots (`0::3`) are refused to them too
(`foreign-share`): a share's limits are the allocation's, and without them the pod would get the whole GPU, over
the shares the scheduler promised the pods placed on it (T78 in docs/security.md). The ids those pods hold reach the
scheduler through the advertiser's PodResources publication (`podresources.py`), so kubegpu places nothing else on
them. Use it
where workloads that bypass kubegpu must keep running on kubegpu nodes; leave it off where every device pod should
carry kubegpu's signed choice.

The API server is read with `--kubeconfig` (default: the in-cluster service account); the process needs `list` on
the pods of its node and `get` on its Node.

Which node this is: `--node-name` is believed only once the Node it names is this host's (`NodeCheck`): its kubelet
reported this host's boot ID (`status.nodeInfo.bootID`, the kernel's `/proc/sys/kernel/random/boot_id`) and, where
both are known, its machine ID (`status.nodeInfo.machineID`, `<host-root>/etc/machine-id`). A name that is another
node's (a hand-written manifest) would list that node's pods: the pods running here would count as gone, their
HAMi-core regions be swept (lifting their limits), and Allocate would answer what the scheduler signed for the other
node's pods. Until it is confirmed, each listing fails with a sentence naming the node and both boot IDs (or where
the machine ID was read: machine IDs are never quoted, T222), so the round removes nothing and the kubelet's calls
are refused with it (T199, T217). One GET of the Node, kept once it matches
(a process outlives no reboot); nodes that share a kernel and a machine ID (containers posing as nodes) cannot be
told apart this way.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from kubegpu.core.annotations import ALLOCATION_KEY, AllocationRecord, init_devices
from kubegpu.core.manifests import SIDECAR_RESTART_POLICY
from kubegpu.core.models import (
    ContainerAllocation,
    ContainerEdit,
    DeviceInventory,
    DeviceOwnership,
    InitStep,
    mounted_path,
    share_slot,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError, make_plugin_manager
from kubegpu.core.process import add_verify_key_argument, parse_interval
from kubegpu.crishim.protos import (
    DEVICE_PLUGIN,
    DEVICE_PLUGIN_PACKAGE,
    DEVICE_PLUGIN_VERSION,
    HEALTHY,
    UNHEALTHY,
    method_path,
)
from kubegpu.crishim.verify import AllocationRefused, PodIdentity, verified_allocation

__all__ = [
    "DevicePluginService",
    "HostIdentity",
    "Inventory",
    "NodeCheck",
    "PendingPods",
    "ResourcePlugin",
    "add_device_plugin_parser",
    "allocate_response",
    "main",
    "run",
    "socket_name",
    "wrong_node",
]

log = logging.getLogger("kubegpu.deviceplugin")

SETTLE_INTERVAL = 0.2  # seconds between listings while a pod kubegpu did not place may be the one being admitted
# How long a pod kubegpu did not place is still counted as possibly being admitted after it left the listing without
# being seen Failed or Succeeded (force-deleted): the kubelet admits the pod object it already has.
VANISHED_MEMORY = 30.0

IDS_HOOK = "kubegpu_device_plugin_ids"
EDIT_HOOK = "kubegpu_device_edit_container"
OWNED_HOOK = "kubegpu_device_owned"
FORGET_HOOK = "kubegpu_device_forget_pods"
KUBELET_SOCKET = "kubelet.sock"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # what the kubelet reports as status.nodeInfo.bootID
MACHINE_IDS = ("etc/machine-id", "var/lib/dbus/machine-id")  # under --host-root: where the kubelet reads its machineID
DEFAULT_DIR = "/var/lib/kubelet/device-plugins"
DESCRIPTION = (
    "Serve the Kubernetes device plugin API (v1beta1) for every resource of the installed kubegpu device plugins: the "
    "kubelet is told the device ids the scheduler allocates, is asked to choose the ids the scheduler signed for the "
    "pod, and gets the devices, env and mounts of a verified kubegpu.io/allocation."
)
_M = DEVICE_PLUGIN


def socket_name(resource: str) -> str:
    """`aws.amazon.com/neurondevice` -> `kubegpu-aws.amazon.com_neurondevice.sock`."""
    return "kubegpu-" + resource.replace("/", "_") + ".sock"


# ---------------------------------------------------------------------------------------------------------------
# What the node has: ids per resource, refreshed every interval
# ---------------------------------------------------------------------------------------------------------------


class Inventory:
    """Every plugin's device-plugin ids per resource, with their health; `changed` wakes ListAndWatch streams."""

    def __init__(self, plugins: KubegpuPluginManager, host_root: Path) -> None:
        self.plugins = plugins
        self.host_root = host_root
        self.ids: dict[str, dict[str, bool]] = {}  # resource -> id -> healthy
        self.owner: dict[str, str] = {}  # resource -> plugin
        self.generation = 0
        self.changed = threading.Condition()

    def refresh(self) -> bool:
        """Discover again; True when some resource's ids or health changed."""
        ids: dict[str, dict[str, bool]] = {}
        owner: dict[str, str] = {}
        for name in self.plugins.names:
            try:
                found = self.plugins.call(name, "kubegpu_device_discover", host_root=self.host_root)
                if found is None:
                    continue
                inventory = self._checked(name, found.model_copy(update={"plugin": name}))
                named = self.plugins.call(name, IDS_HOOK, inventory=inventory)
            except PluginHookError as exc:
                log.error("plugin skipped: %s", exc)
                for resource, plugin in self.owner.items():  # nothing new is known: what it had stays
                    if plugin == name:
                        ids[resource], owner[resource] = self.ids[resource], name
                continue
            for resource, devices in (named or {}).items():
                ids[resource] = {str(k): bool(v) for k, v in devices.items()}
                owner[resource] = name
        with self.changed:
            if ids == self.ids and owner == self.owner:
                return False
            self.ids, self.owner = ids, owner
            self.generation += 1
            self.changed.notify_all()
        return True

    def _checked(self, name: str, inventory: DeviceInventory) -> DeviceInventory:
        health = self.plugins.call(name, "kubegpu_device_health", host_root=self.host_root, inventory=inventory)
        if not health:
            return inventory
        devices = [d if health.get(d.id, True) else d.model_copy(update={"healthy": False}) for d in inventory.devices]
        return inventory.model_copy(update={"devices": devices})

    def wait_change(self, generation: int, timeout: float) -> int:
        with self.changed:
            self.changed.wait_for(lambda: self.generation != generation, timeout=timeout)
            return self.generation


# ---------------------------------------------------------------------------------------------------------------
# Which pod is being admitted: the pending pods of this node with a verified allocation
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Candidate:
    """A pod bound to this node and not started, that requests some resource: `record` is its verified allocation,
    None when it has none (kubegpu did not place it, or its allocation failed a check: `unverified` says which);
    `order` is its containers' admission order and `requests` what each asks (None: a count that cannot be read);
    `classic` its init containers that are no sidecars; `mounts` what the kubelet mounts where in each container
    from its pod spec (`_mount_paths`); `envs` each container's own `env` (a value from elsewhere, `valueFrom`, as
    None) and `env_from` the prefixes of its `envFrom` entries ("" for none): the kubelet passes both after
    Allocate's env, and the runtime keeps the last value of a name (`refuse_overriding_env`)."""

    pod: PodIdentity
    created: str
    record: AllocationRecord | None
    order: list[str]
    requests: dict[str, dict[str, int | None]]
    unverified: str = ""
    classic: frozenset[str] = frozenset()
    mounts: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    envs: dict[str, tuple[tuple[str, str | None], ...]] = field(default_factory=dict)
    env_from: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def ids(self, container: str, resource: str) -> list[str]:
        """The ids the allocation names for `container` (a classic init container's from `init`)."""
        if self.record is None:
            return []
        return list(self.record.given(container).get(resource, []))

    def pod_ids(self, resource: str) -> list[str]:
        """Every id of `resource` the allocation names for the pod, each once."""
        if self.record is None:
            return []
        named = [*self.record.containers.values(), *self.record.init.values()]
        return list(dict.fromkeys(i for resources in named for i in resources.get(resource, ())))


@dataclass(frozen=True)
class Slot:
    """The container of a pending pod that the kubelet allocates `resource` for next, if it admits that pod now."""

    candidate: Candidate
    container: str
    count: int | None  # None: any count
    ids: tuple[str, ...]  # the verified ids; () when the pod has no verified allocation of them

    def fits(self, size: int) -> bool:
        return self.count is None or self.count == size


@dataclass
class PendingPods:
    """The pods the kubelet may be admitting, read from the API server, and the containers already allocated."""

    list_pods: Callable[[], list[dict[str, Any]]]
    node: str
    key: bytes
    candidates: list[Candidate] = field(default_factory=list)
    allocated: set[tuple[str, str, str]] = field(default_factory=set)  # (pod uid, container, resource)
    verify_keys: tuple[bytes, ...] = ()  # accepted besides `key`, during a rotation (--allocation-verify-key-file)
    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: Callable[[], float] = time.monotonic
    # Pods kubegpu did not place that left the listing while pending (force-deleted), by uid, with when they left:
    # still counted until a refusal has been answered on their account or `VANISHED_MEMORY` has passed.
    vanished: dict[str, tuple[Candidate, float]] = field(default_factory=dict)
    blamed: set[str] = field(default_factory=set)  # uids of unplaced pods a refusal has been answered on account of

    def refresh(self) -> None:
        """List the node's pods again (raises `ConnectionError` when the API server cannot say).

        A pod being deleted still counts while its phase is pending: the kubelet may be admitting it (a tenant's
        finalizer keeps it so as long as it likes). One kubegpu did not place that disappears from the listing
        unseen in a final phase (force-deleted) counts as `vanished` (above): deleting its own pod in the middle
        of its admission must not make the kubelet's call look like the placed pod's."""
        pods = self.list_pods()
        candidates = []
        listed: set[str] = set()
        for pod in pods:
            metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            phase = (pod.get("status") or {}).get("phase")
            listed.add(str(metadata.get("uid", "")))
            if phase not in (None, "Pending"):
                continue
            init, apps = spec.get("initContainers") or [], spec.get("containers") or []
            requests = {str(c.get("name", "")): _requests(c) for c in [*init, *apps]}
            text = (metadata.get("annotations") or {}).get(ALLOCATION_KEY)
            if text is None and not any(requests.values()):
                continue  # asks for no device: the kubelet never calls a device plugin for it
            identity = PodIdentity(metadata.get("namespace", ""), metadata.get("name", ""), metadata.get("uid", ""))
            record, unverified = None, f"no {ALLOCATION_KEY}"
            if text is not None:
                try:
                    record = verified_allocation(
                        str(text), key=self.key, node=self.node, pod=identity, also=self.verify_keys
                    )
                except AllocationRefused as refused:
                    log.warning(
                        "pod %s: allocation ignored: %s", identity.key, refused, extra={"reason": refused.check}
                    )
                    unverified = f"its {ALLOCATION_KEY} failed the {refused.check} check"
            created = str(metadata.get("creationTimestamp", ""))
            classic = frozenset(
                str(c.get("name", "")) for c in init if c.get("restartPolicy") != SIDECAR_RESTART_POLICY
            )
            if record is not None and not record.init and classic:
                record = _with_init(record, init, requests)
            mounts = {str(c.get("name", "")): _mount_paths(c) for c in [*init, *apps]}
            envs = {str(c.get("name", "")): _own_env(c) for c in [*init, *apps]}
            env_from = {str(c.get("name", "")): _env_from_prefixes(c) for c in [*init, *apps]}
            candidates.append(
                Candidate(
                    identity, created, record, list(requests), requests, unverified, classic, mounts, envs, env_from
                )
            )
        now = self.clock()
        with self.lock:
            for candidate in self.candidates:
                uid = candidate.pod.uid
                if candidate.record is None and uid not in listed and uid not in self.blamed:
                    self.vanished.setdefault(uid, (candidate, now))
            self.vanished = {
                uid: (candidate, since)
                for uid, (candidate, since) in self.vanished.items()
                if uid not in listed and now - since < VANISHED_MEMORY
            }
            candidates += [candidate for candidate, _ in self.vanished.values()]
            candidates.sort(key=lambda c: (c.created, c.record.issued if c.record else 0, c.pod.key))
            self.candidates = candidates
            live = {c.pod.uid for c in candidates}
            self.allocated = {entry for entry in self.allocated if entry[0] in live}
            self.blamed &= live

    def _slots(self, resource: str, size: int) -> list[Slot]:
        """For each pending pod, in the kubelet's admission order, the container it would allocate `size` of
        `resource` for next (init containers, then containers; the ones this process answered for are done)."""
        slots = []
        for candidate in self.candidates:
            for container in candidate.order:
                ids = candidate.ids(container, resource)
                count = candidate.requests[container].get(resource, len(ids) if ids else 0)
                if count == 0 or (candidate.pod.uid, container, resource) in self.allocated:
                    continue
                slot = Slot(candidate, container, count, tuple(ids) if count in (None, len(ids)) else ())
                if slot.fits(size):
                    slots.append(slot)
                break
        return slots

    def settle(self, resource: str, size: int, budget: float) -> None:
        """While a pod kubegpu did not place and one it placed both ask `size` of `resource` next, list the pods again
        every `SETTLE_INTERVAL` for at most `budget` seconds. The kubelet writes a pod whose admission failed as
        Failed within moments: the pod admitted after it must not be refused because it still looked pending."""
        deadline = time.monotonic() + budget
        while True:
            with self.lock:
                slots = self._slots(resource, size)
            if all(slot.ids for slot in slots) or not any(slot.ids for slot in slots):
                return
            if time.monotonic() + SETTLE_INTERVAL > deadline:
                return
            time.sleep(SETTLE_INTERVAL)
            try:
                self.refresh()
            except ConnectionError:
                return

    def preferred(self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """The ids the scheduler signed for the next container the kubelet admits, or [] when none fits, or when a
        pod kubegpu did not place could be the one being admitted (it must not be steered onto another's ids)."""
        free = set(available) | set(must_include)
        with self.lock:
            slots = self._slots(resource, size)
            if any(not slot.ids for slot in slots):
                return []
            for slot in slots:
                if free.issuperset(slot.ids) and set(must_include) <= set(slot.ids):
                    return list(slot.ids)
            for slot in slots:
                # The kubelet kept some of an init container's devices for this container (`must_include`), not
                # necessarily the ones named to it: the rest come from its own, then from the pod's other ids.
                if must_include and set(must_include) <= self._reusable(slot.candidate, resource):
                    rest = [i for i in (*slot.ids, *slot.candidate.pod_ids(resource)) if i in free]
                    chosen = list(dict.fromkeys([*must_include, *rest]))[:size]
                    if len(chosen) == size:
                        return chosen
        return []

    def claim(self, resource: str, ids: Sequence[str]) -> tuple[Candidate, str] | None:
        """The pod container whose verified allocation of `resource` is exactly `ids`, now marked allocated; None
        when no pending pod's is.

        Raises `AllocationRefused` (`ambiguous`) when a pending pod without a verified allocation of `resource` asks
        the same count: the kubelet does not say which pod it admits, and that pod must never get another's
        signed devices, so neither gets any until it has left the pending pods (refused, started or deleted).
        A container after an allocated init container of its pod may be given any of the pod's ids instead
        (`_reused`): the kubelet hands it the init containers' devices, picking among them itself.
        """
        wanted = sorted(ids)
        with self.lock:
            slots = self._slots(resource, len(wanted))
            match = next((slot for slot in slots if sorted(slot.ids) == wanted), None)
            if match is None:
                match = self._reused(slots, resource, wanted)
            if match is None:
                return None
            unplaced = [slot for slot in slots if not slot.ids]
            if unplaced:
                # This refusal may be the answer to an unplaced pod's own admission: a vanished one is then done with.
                self.blamed.update(slot.candidate.pod.uid for slot in unplaced)
                for slot in unplaced:
                    if self.vanished.pop(slot.candidate.pod.uid, None) is not None:
                        self.candidates.remove(slot.candidate)
                raise AllocationRefused("ambiguous", _ambiguous(resource, wanted, match, unplaced))
            self.allocated.add((match.candidate.pod.uid, match.container, resource))
            return match.candidate, match.container

    def _reusable(self, candidate: Candidate, resource: str) -> set[str]:
        """The ids of `resource` the kubelet may hand the pod's next container from its allocated init containers:
        theirs, and (for what it takes beyond them) the pod's others; empty until one of them is allocated."""
        uid = candidate.pod.uid
        if not any((uid, c, resource) in self.allocated for c in candidate.classic):
            return set()
        return set(candidate.pod_ids(resource))

    def _reused(self, slots: list[Slot], resource: str, wanted: list[str]) -> Slot | None:
        """The slot of a pod an init container of which was allocated `resource`, and whose allocation names every
        id of `wanted`: the kubelet gives the containers after an init container its devices (any of them, its own
        pick) and, where they ask more, others the plugin prefers (`preferred`: the pod's)."""
        for slot in slots:
            if slot.ids and set(wanted) <= self._reusable(slot.candidate, resource):
                return slot
        return None


def _with_init(
    record: AllocationRecord, init: list[dict[str, Any]], requests: dict[str, dict[str, int | None]]
) -> AllocationRecord:
    """`record` as the scheduler writes it now, for an allocation written before its `init` field existed: what each
    classic init container asking a device the allocation names none of to it is given of its pod's (`init_devices`,
    over the pod's init containers), as the device plugin then gave it (an app container's ids). Every id it names is
    one the signed `containers` names for the pod, so reading it so gives the pod nothing it was not signed."""
    steps: list[InitStep] = []
    sidecars: list[str] = []
    for container in init:
        name = str(container.get("name", ""))
        if container.get("restartPolicy") == SIDECAR_RESTART_POLICY:
            sidecars.append(name)
            continue
        own = record.containers.get(name, {})  # a device it held itself then (one only init containers ask)
        asked = {resource: count for resource, count in requests.get(name, {}).items() if count and resource not in own}
        if asked:
            steps.append(InitStep(name, asked, tuple(sidecars)))
    given, lent = init_devices(record.containers, record.shares, tuple(steps))
    if not given:
        return record
    return record.model_copy(update={"init": given, "shares": {**record.shares, **lent}})


def _requests(container: Mapping[str, Any]) -> dict[str, int | None]:
    """What a container asks of each resource, as the kubelet's device manager reads it (limits; requests where
    no limit is given); None for a count that is not a whole number."""
    resources = container.get("resources") or {}
    asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    counts: dict[str, int | None] = {}
    for resource, quantity in asked.items():
        if "/" not in str(resource):
            continue  # cpu, memory, ephemeral-storage, hugepages-*: never a device plugin's
        text = str(quantity).strip()
        counts[str(resource)] = int(text) if text.isascii() and text.isdigit() and len(text) < 10 else None
    return {r: n for r, n in counts.items() if n != 0}


VOLUME, TERMINATION_FILE = "a volume", "its termination message file"


def _mount_paths(container: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """What the kubelet mounts in a container of a pod spec at a path the spec names, as (what, path written; the
    runtime cleans the path when it mounts): its volumes (`mountPath`) and, at `terminationMessagePath`, a writable
    file of the kubelet's own, made empty for each run of the container."""
    mounts = container.get("volumeMounts") or []
    paths = tuple((VOLUME, str(m.get("mountPath", ""))) for m in mounts if isinstance(m, Mapping))
    termination = container.get("terminationMessagePath")
    return (*paths, (TERMINATION_FILE, str(termination))) if termination else paths


def _own_env(container: Mapping[str, Any]) -> tuple[tuple[str, str | None], ...]:
    """A pod spec container's `env`, in order: (name, its literal value; None for one the kubelet resolves from
    elsewhere, `valueFrom`)."""
    entries = container.get("env") or []
    return tuple(
        (str(e.get("name", "")), None if e.get("valueFrom") is not None else str(e.get("value") or ""))
        for e in entries
        if isinstance(e, Mapping)
    )


def _env_from_prefixes(container: Mapping[str, Any]) -> tuple[str, ...]:
    """The `prefix` of each of a pod spec container's `envFrom` entries ("" where it has none: every key)."""
    entries = container.get("envFrom") or []
    return tuple(str(e.get("prefix") or "") for e in entries if isinstance(e, Mapping))


def refuse_overriding_env(
    owned: DeviceOwnership | None,
    candidate: Candidate,
    container: str,
    plugin: str,
    answered: Mapping[str, str],
) -> None:
    """Refuse (`env`) a container whose own env could stand in for what Allocate answers, or for a variable the
    owning plugin owns: an `env` entry naming one, unless it is one the answer sets to exactly its value, or an
    `envFrom` whose prefix could make one (a ConfigMap or Secret's keys are not the node's to read).

    The kubelet passes Allocate's env first and the container's own `envFrom` and `env` after it, and the runtime
    keeps the last value of a name (as the image's `ENV` ranks below all of them); a device plugin cannot remove
    them. A container given one tile of an Intel card that set `ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE` read the FLAT
    mask `0` as the whole of card0, both tiles (T210). The answer is computed from the container's literal values
    (less the owned), as the CRI shim computes it, so a spec asking `COMPOSITE` exactly gets a mask written in
    COMPOSITE and is admitted; `answered` holds only the variables whose value differs from the container's."""
    for name, value in candidate.envs.get(container, ()):
        if owned is not None and owned.owns_env(name):
            why = f"the {plugin} plugin owns it (device selection, or the limits of a share)"
        elif name in answered:  # set to another value than the container's (whose last entry the kubelet keeps)
            shown = "from elsewhere (valueFrom)" if value is None else f"to {value[:80]!r}"
            why = f"it is set {shown}, and the node sets it to {answered[name][:80]!r} for the devices given"
        else:
            continue
        raise AllocationRefused(
            "env",
            f"pod {candidate.pod.key} container {container} sets {name[:120]} in its env, which would stand in for "
            f"the node's: {why}; the kubelet passes a container's own env after the device plugin's, so the "
            "container is refused; remove that env entry (or, for a device hierarchy, write one the node uses: "
            "FLAT or COMPOSITE)",
        )
    for prefix in candidate.env_from.get(container, ()):
        names = [*answered, *(owned.envs if owned else ()), *(owned.env_prefixes if owned else ())]
        reached = [n for n in names if n.startswith(prefix)]
        reached += [p for p in (owned.env_prefixes if owned else ()) if prefix.startswith(p)]
        if not reached:
            continue
        raise AllocationRefused(
            "env",
            f"pod {candidate.pod.key} container {container} imports env from a ConfigMap or Secret (envFrom) "
            + (f"with the prefix {prefix[:120]!r}" if prefix else "without a prefix")
            + f", whose keys could set {reached[0]}, which the node sets for the devices given or the {plugin} "
            "plugin owns; the kubelet passes them after the device plugin's env, so the container is refused; give "
            "that envFrom a prefix no such variable starts with (prefix: APP_)",
        )


def refuse_owned_mounts(
    owned: DeviceOwnership | None, candidate: Candidate, container: str, plugin: str, edit: ContainerEdit
) -> None:
    """Refuse (`mount`) a container that mounts one of its pod's volumes, or its termination message file, where
    the owning plugin's answer mounts something, or under it, or at a path the plugin owns (`kubegpu_device_owned`).

    The CRI shim removes such a mount from the container; a device plugin cannot: the kubelet mounts the pod's
    volumes and then the termination message file itself, after the device plugin's mounts, and the runtime mounts
    the later of two mounts at one path on top. A volume at `/overrideEnv`, `/etc/ld.so.preload` or over HAMi-core's
    region directory would lift the GPU share's limits, and so would the kubelet's empty termination message file at
    `/etc/ld.so.preload` (HAMi-core never loaded); so the pod is refused its admission, with the mount named."""
    answered = [mounted_path(m.container_path) for m in edit.mounts]
    for mount, written in candidate.mounts.get(container, ()):
        path = mounted_path(written)
        covered = next((a for a in answered if path == a or path.startswith(f"{a}/")), None)
        if covered is None and (owned is None or not owned.owns_mount(written)):
            continue
        what = f"the {plugin} plugin mounts {covered} there" if covered else f"the {plugin} plugin owns that path"
        change = (
            "remove that volumeMount" if mount == VOLUME else "leave terminationMessagePath at /dev/termination-log"
        )
        raise AllocationRefused(
            "mount",
            f"pod {candidate.pod.key} container {container} mounts {mount} at {written[:200]!r}, where {what} on "
            "this node (device selection, or the GPU share limits and the files HAMi-core reads): the kubelet would "
            f"mount it over the node's, so the container is refused; {change}",
        )


def _unplaced_because(slot: Slot, resource: str) -> str:
    if slot.candidate.record is None:
        return slot.candidate.unverified
    return f"its {ALLOCATION_KEY} signs no {slot.count} {resource} for container {slot.container}"


def _ambiguous(resource: str, ids: Sequence[str], match: Slot, unplaced: Sequence[Slot]) -> str:
    others = ", ".join(f"{s.candidate.pod.key} ({_unplaced_because(s, resource)})" for s in unplaced[:3])
    more = f" and {len(unplaced) - 3} more" if len(unplaced) > 3 else ""
    return (
        f"{resource} {','.join(ids)}: these are the devices the scheduler signed for pod {match.candidate.pod.key}, "
        f"but pod {others}{more} is pending on this node too, asks the same count, and may be the one the kubelet "
        "is admitting; the kubelet does not say which, so neither gets devices while both are pending. Pods "
        "requesting kubegpu resources must be scheduled by kubegpu (its scheduler, or kube-scheduler with the "
        "kubegpu extender), not placed with spec.nodeName"
    )


def allocate_response(
    plugins: KubegpuPluginManager,
    plugin: str,
    candidate: Candidate,
    container: str,
    resource: str,
    ids: Sequence[str],
    dev_root: Path,
) -> Any:
    """The ContainerAllocateResponse for one container: what the CRI shim would add to it for these ids."""
    record = candidate.record
    if record is None:  # `claim` matches verified allocations only
        raise AllocationRefused("missing", f"pod {candidate.pod.key} has no verified {ALLOCATION_KEY}")
    # A GPU share names its amounts under resources of its own (nvidia.com/gpucores beside nvidia.com/gpu), which
    # the kubelet does not allocate through a device plugin: the container's shares of the same plugin go along.
    shares = {
        r: dict(s)
        for r, s in record.shares.get(container, {}).items()
        if r == resource or plugins.owner_of(r) == plugin
    }
    allocation = ContainerAllocation(
        pod_uid=record.podUID,
        node=record.node,
        container=container,
        resources={resource: list(ids)},
        shares=shares,
        fields=dict(record.plugins.get(plugin, {})),
    )
    found = plugins.call(plugin, OWNED_HOOK)
    owned = found if isinstance(found, DeviceOwnership) else None
    # The container's own literal env, as the CRI shim's edit sees it (the owned left out): a plugin writes what it
    # sets in the terms the container asked for (an Intel tile mask in the device hierarchy it names).
    asked = {
        name: value
        for name, value in candidate.envs.get(container, ())
        if value is not None and (owned is None or not owned.owns_env(name))
    }
    edit = ContainerEdit(envs=dict(asked))
    plugins.call(plugin, EDIT_HOOK, allocation=allocation, edit=edit, dev_root=dev_root)
    edit = ContainerEdit.model_validate(edit.model_dump(warnings=False))
    answered = {name: value for name, value in edit.envs.items() if asked.get(name) != value}
    refuse_overriding_env(owned, candidate, container, plugin, answered)
    refuse_owned_mounts(owned, candidate, container, plugin, edit)
    return _M["ContainerAllocateResponse"](
        envs=answered,
        mounts=[
            _M["Mount"](container_path=m.container_path, host_path=m.host_path, read_only=m.readonly)
            for m in edit.mounts
        ],
        devices=[
            _M["DeviceSpec"](container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in edit.devices
        ],
        annotations=edit.annotations,
        cdi_devices=[_M["CDIDevice"](name=n) for n in edit.cdi_devices],
    )


# ---------------------------------------------------------------------------------------------------------------
# One resource: its DevicePlugin service on its own socket
# ---------------------------------------------------------------------------------------------------------------


class ResourcePlugin:
    """The DevicePlugin service of one resource."""

    def __init__(self, service: DevicePluginService, resource: str) -> None:
        self.service = service
        self.resource = resource
        self.stopping = threading.Event()

    def handlers(self) -> grpc.GenericRpcHandler:
        def unary(function: Callable[[Any, grpc.ServicerContext], Any], request: str) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                function,
                request_deserializer=_M[request].FromString,
                response_serializer=lambda message: message.SerializeToString(),
            )

        methods = {
            "GetDevicePluginOptions": unary(self.options, "Empty"),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self.list_and_watch,
                request_deserializer=_M["Empty"].FromString,
                response_serializer=lambda message: message.SerializeToString(),
            ),
            "GetPreferredAllocation": unary(self.preferred, "PreferredAllocationRequest"),
            "Allocate": unary(self.allocate, "AllocateRequest"),
            "PreStartContainer": unary(lambda _r, _c: _M["PreStartContainerResponse"](), "PreStartContainerRequest"),
        }
        return grpc.method_handlers_generic_handler(f"{DEVICE_PLUGIN_PACKAGE}.DevicePlugin", methods)

    def options(self, request: Any, context: grpc.ServicerContext) -> Any:
        return _M["DevicePluginOptions"](pre_start_required=False, get_preferred_allocation_available=True)

    def devices(self) -> Any:
        ids = self.service.inventory.ids.get(self.resource, {})
        return _M["ListAndWatchResponse"](
            devices=[_M["Device"](ID=i, health=HEALTHY if ok else UNHEALTHY) for i, ok in ids.items()]
        )

    def list_and_watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        inventory = self.service.inventory
        generation = inventory.generation
        yield self.devices()
        while context.is_active() and not self.stopping.is_set():
            now = inventory.wait_change(generation, timeout=1.0)
            if now != generation:
                generation = now
                yield self.devices()

    def preferred(self, request: Any, context: grpc.ServicerContext) -> Any:
        pods = self.service.pods
        try:
            pods.refresh()
        except ConnectionError as exc:
            log.warning("GetPreferredAllocation without the API server (%s): no preference", exc)
        responses = []
        for entry in request.container_requests:
            available, included = list(entry.available_deviceIDs), list(entry.must_include_deviceIDs)
            pods.settle(self.resource, entry.allocation_size, self.service.settle_seconds)
            if any(share_slot(i) is not None for i in (*available, *included)):  # share slots: prefer by device
                devices = pods.preferred(
                    self.resource, _devices_of(available), _devices_of(included), entry.allocation_size
                )
                ids = _slots_for(devices, available, included)
            else:
                ids = pods.preferred(self.resource, available, included, entry.allocation_size)
            if not ids:
                log.warning(
                    "no preference: no pending pod on this node has a verified allocation of %d %s among the available "
                    "ids, or a pod kubegpu did not place asks the same and may be the one being admitted",
                    entry.allocation_size,
                    self.resource,
                )
            responses.append(_M["ContainerPreferredAllocationResponse"](deviceIDs=ids))
        return _M["PreferredAllocationResponse"](container_responses=responses)

    def allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        started = time.perf_counter()
        responses = []
        for entry in request.container_requests:
            ids = list(entry.devicesIDs)
            try:
                responses.append(self._allocate_one(ids))
            except AllocationRefused as refused:
                log.warning("refused Allocate: %s", refused, extra={"reason": refused.check})
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"kubegpu: {refused.check} check failed: {refused}")
            except ConnectionError as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"kubegpu: {exc}")
        self.service.allocate_seconds.append(time.perf_counter() - started)
        return _M["AllocateResponse"](container_responses=responses)

    def _allocate_one(self, slots: list[str]) -> Any:
        pods = self.service.pods
        ids = shared_devices(self.resource, slots)  # the kubelet's ids, as the devices the allocation names
        found: tuple[Candidate, str] | None = None
        try:
            found = pods.claim(self.resource, ids)
        except AllocationRefused:  # a pod kubegpu did not place looked pending: it may have been refused since
            pods.settle(self.resource, len(ids), self.service.settle_seconds)
        if found is None:
            pods.refresh()
            try:
                found = pods.claim(self.resource, ids)
            except AllocationRefused:
                if self.service.foreign_pods != "allow":
                    raise
        if found is None and self.service.foreign_pods == "allow":
            if slots != ids:
                raise AllocationRefused(
                    "foreign-share",
                    f"{self.resource} {_listed(slots)} (shares of device {_listed(ids)}): no pod bound to this node "
                    f"has a verified {ALLOCATION_KEY} for these share slots, and a share's limits come only from one; "
                    "a pod kubegpu did not place is not given a share even with --foreign-pods allow (it would get "
                    "the whole device, over the shares of the pods placed on it): schedule it with kubegpu",
                )
            found = _foreign(pods.node, self.resource, ids)
        if found is None:
            named = "" if slots == ids else f" (shares of device {_listed(ids)})"
            raise AllocationRefused(
                "missing",
                f"{self.resource} {_listed(slots)}{named}: no pod bound to this node has a verified "
                f"{ALLOCATION_KEY} giving one container exactly these devices; pods requesting kubegpu resources must "
                "be scheduled by kubegpu (its scheduler, or kube-scheduler with the kubegpu extender)",
            )
        candidate, container = found
        plugin = self.service.inventory.owner.get(self.resource) or self.service.plugins.owner_of(self.resource)
        if plugin is None:
            raise AllocationRefused("plugin", f"no installed device plugin handles {self.resource}")
        try:
            with self.service.editing:  # never while the pods gone are forgotten (`forget_gone_pods`)
                response = allocate_response(
                    self.service.plugins, plugin, candidate, container, self.resource, ids, self.service.dev_root
                )
        except AllocationRefused:
            raise
        except Exception as exc:
            raise AllocationRefused(
                "plugin", f"pod {candidate.pod.key} container {container}: the allocation cannot be applied: {exc}"
            ) from None
        shares = "" if slots == ids else f" (slots {','.join(slots)})"
        log.info(
            "allocated",
            extra={"pod": candidate.pod.key, "devices": f"{container}:{self.resource}={','.join(ids)}{shares}"},
        )
        return response


# ---------------------------------------------------------------------------------------------------------------
# Share slots: a device several containers share, listed once per slot (`core.models.slot_id`)
# ---------------------------------------------------------------------------------------------------------------


def shared_devices(resource: str, ids: Sequence[str]) -> list[str]:
    """The devices the kubelet's `ids` name: the ids themselves, or for share slot ids (`0::3`), each slot's device.

    Raises `AllocationRefused` (`shares`) when they do not add up to what an allocation can name: slot ids mixed with
    device ids, or two slots of one device for one container (the scheduler gives a container at most one share of
    each device, so `nvidia.com/gpu: 2` means shares of two GPUs)."""
    slots = [share_slot(i) for i in ids]
    if not any(slots):
        return list(ids)
    if not all(slots):
        plain = ", ".join(i for i, slot in zip(ids, slots, strict=True) if slot is None)
        raise AllocationRefused(
            "shares", f"{resource} {_listed(ids)}: share slots mixed with device ids ({plain[:200]}) for one container"
        )
    devices = [slot[0] for slot in slots if slot is not None]
    counts = Counter(devices)  # once: a container may ask for every slot of a node (1000 per GPU)
    twice = sorted(d for d, n in counts.items() if n > 1)
    if twice:
        raise AllocationRefused(
            "shares",
            f"{resource} {_listed(ids)}: {counts[twice[0]]} share slots of device {twice[0]} for one "
            f"container; a container gets at most one share of each device, so its {len(ids)} {resource} must be "
            f"slots of {len(ids)} different devices, the ones the scheduler's {ALLOCATION_KEY} names",
        )
    return devices


def _listed(ids: Sequence[str], limit: int = 8) -> str:
    """Ids for a message, at most `limit` of them (a container may ask for a thousand share slots)."""
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return ",".join(ids[:limit]) + more


def _devices_of(ids: Sequence[str]) -> list[str]:
    """The devices of share slot ids, each once, in order (ids that are no slot are left out)."""
    return list(dict.fromkeys(slot[0] for slot in map(share_slot, ids) if slot is not None))


def _slots_for(devices: Sequence[str], available: Sequence[str], included: Sequence[str]) -> list[str]:
    """One slot id of each of `devices` for the kubelet to prefer: a must-include one where it names the device,
    else the device's lowest available slot. [] when some device has none."""
    wanted = set(devices)
    must: dict[str, str] = {}  # device -> its first must-include slot
    lowest: dict[str, tuple[int, str]] = {}  # device -> (its lowest available slot's number, the slot)
    for i in included:
        slot = share_slot(i)
        if slot is not None and slot[0] in wanted:
            must.setdefault(slot[0], i)
    for i in available:
        slot = share_slot(i)
        if slot is not None and slot[0] in wanted and slot[0] not in must:
            known = lowest.get(slot[0])
            if known is None or slot[1] < known[0]:
                lowest[slot[0]] = (slot[1], i)
    chosen = []
    for device in devices:
        if device in must:
            chosen.append(must[device])
        elif device in lowest:
            chosen.append(lowest[device][1])
        else:
            return []
    return chosen


FOREIGN = "(a pod kubegpu did not place)"


def _foreign(node: str, resource: str, ids: Sequence[str]) -> tuple[Candidate, str]:
    """With `--foreign-pods allow`: a stand-in for a pod without a kubegpu allocation, holding the kubelet's ids."""
    record = AllocationRecord(version=1, node=node, podUID=FOREIGN, containers={FOREIGN: {resource: list(ids)}})
    asks: dict[str, dict[str, int | None]] = {FOREIGN: {resource: len(ids)}}
    return Candidate(PodIdentity("", FOREIGN, FOREIGN), "", record, [FOREIGN], asks), FOREIGN


# ---------------------------------------------------------------------------------------------------------------
# The process: servers, registration, re-registration
# ---------------------------------------------------------------------------------------------------------------


class DevicePluginService:
    """Serves every resource on its socket in `directory` and keeps them registered with the kubelet."""

    def __init__(
        self,
        plugins: KubegpuPluginManager,
        pods: PendingPods,
        *,
        directory: Path,
        host_root: Path,
        dev_root: Path,
        interval: float = 10.0,
        foreign_pods: str = "refuse",
        settle_seconds: float = 2.0,
    ) -> None:
        self.plugins = plugins
        self.foreign_pods = foreign_pods
        self.settle_seconds = settle_seconds
        self.pods = pods
        self.directory = directory
        self.dev_root = dev_root
        self.interval = interval
        self.inventory = Inventory(plugins, host_root)
        self.servers: dict[str, tuple[grpc.Server, ResourcePlugin, int]] = {}  # resource -> (server, plugin, inode)
        self.kubelet_inode: int | None = None
        self.registrations = 0
        self._registered: set[str] = set()
        self.allocate_seconds: list[float] = []
        self.stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        # Held by each Allocate's plugin edit, and by `forget_gone_pods` from its listing to its plugins' return.
        self.editing = threading.Lock()

    @property
    def kubelet_socket(self) -> Path:
        return self.directory / KUBELET_SOCKET

    def start(self) -> None:
        self.inventory.refresh()
        self.sync()
        self._thread = threading.Thread(target=self._loop, name="device-plugin-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for resource in list(self.servers):
            self._stop_server(resource)

    def _loop(self) -> None:
        next_refresh = time.monotonic() + self.interval
        while not self.stop_event.wait(1.0):
            try:
                if time.monotonic() >= next_refresh:
                    next_refresh = time.monotonic() + self.interval
                    if self.inventory.refresh():
                        log.info("devices changed: %s", _summary(self.inventory.ids))
                    self.forget_gone_pods()
                self.sync()
            except Exception:
                log.exception("device plugin round failed")

    def forget_gone_pods(self) -> None:
        """Tell every plugin the UIDs of the pods the API server lists on this node, whatever their phase
        (`kubegpu_device_forget_pods`), so that each removes what it keeps on the host for the others (HAMi-core's
        region directories). Under `editing`, with the pods listed under it: an Allocate's pod was listed before
        its edit, and a LIST after the edit lists it too until it is deleted, so no pod whose container is being
        given its devices is among the gone. Never raises: an API server that cannot say (unreachable, or a listing
        with an item that is no pod with a UID, which could be any pod's), or a failing plugin, is logged and the work
        waits for the next interval; the interval's other work (re-registering with the kubelet) goes on."""
        with self.editing:
            try:
                live = _listed_uids(self.pods.list_pods())
            except Exception as exc:  # ConnectionError, or an answer not shaped as a list at all
                log.warning("cannot say which pods are gone from the node: %s: %s", type(exc).__name__, str(exc)[:300])
                return
            if live is None:
                log.warning(
                    "cannot say which pods are gone from the node: the API server's listing has an item that is no "
                    "pod with a UID"
                )
                return
            for name in self.plugins.names:
                try:
                    self.plugins.call(name, FORGET_HOOK, live_pods=live)
                except PluginHookError as exc:
                    log.error("%s; what it keeps for gone pods stays until the next interval", exc)

    def sync(self) -> None:
        """Serve every resource and register it; again after the kubelet restarted or removed a socket."""
        inode = _inode(self.kubelet_socket)
        restarted = inode is not None and inode != self.kubelet_inode
        for resource in list(self.servers):
            _, _, served = self.servers[resource]
            gone = _inode(self.directory / socket_name(resource)) != served
            if resource not in self.inventory.ids or restarted or gone:
                self._stop_server(resource)
        if inode is None:
            return  # no kubelet yet: registered when its socket appears
        for resource in self.inventory.ids:
            if resource not in self.servers:
                self._serve(resource)
        missing = [r for r in self.inventory.ids if r not in self._registered]
        for resource in missing:
            if self._register(resource):
                self._registered.add(resource)
        self.kubelet_inode = inode

    def _serve(self, resource: str) -> None:
        path = self.directory / socket_name(resource)
        path.unlink(missing_ok=True)
        plugin = ResourcePlugin(self, resource)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="device-plugin"))
        server.add_generic_rpc_handlers((plugin.handlers(),))
        previous = os.umask(0o177)
        try:
            server.add_insecure_port(f"unix://{path}")
        finally:
            os.umask(previous)
        server.start()
        self.servers[resource] = (server, plugin, _inode(path) or 0)
        self._registered.discard(resource)

    def _stop_server(self, resource: str) -> None:
        server, plugin, _ = self.servers.pop(resource)
        plugin.stopping.set()
        server.stop(0.5).wait()
        self._registered.discard(resource)

    def _register(self, resource: str) -> bool:
        request = _M["RegisterRequest"](
            version=DEVICE_PLUGIN_VERSION,
            endpoint=socket_name(resource),
            resource_name=resource,
            options=_M["DevicePluginOptions"](pre_start_required=False, get_preferred_allocation_available=True),
        )
        try:
            with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                channel.unary_unary(
                    method_path(DEVICE_PLUGIN_PACKAGE, "Registration", "Register"),
                    request_serializer=lambda message: message.SerializeToString(),
                    response_deserializer=_M["Empty"].FromString,
                )(request, timeout=5)
        except grpc.RpcError as exc:
            call: Any = exc
            log.warning("registering %s with the kubelet failed (retrying): %s", resource, call.details())
            return False
        self.registrations += 1
        log.info("registered %s with the kubelet (%s)", resource, socket_name(resource))
        return True


@dataclass(frozen=True)
class HostIdentity:
    """What this host's kubelet reports of it in its Node's `status.nodeInfo`; '' where it cannot be read here."""

    boot_id: str
    machine_id: str
    machine_id_file: str = ""

    @classmethod
    def read(cls, host_root: Path, boot_id: Path = BOOT_ID) -> HostIdentity:
        machine_id, machine_id_file = "", ""
        for relative in MACHINE_IDS:
            machine_id = _read_id(host_root / relative)
            if machine_id:
                machine_id_file = str(host_root / relative)
                break
        return cls(_read_id(boot_id), machine_id, machine_id_file)


def wrong_node(node: str, node_info: Any, host: HostIdentity) -> str | None:
    """Why the Node `node`, whose `status.nodeInfo` is `node_info`, is not this host's; None when nothing says so.

    Its boot ID must be this host's (the kubelet reads the kernel's, as this process does), and so must its machine
    ID where both are known. A Node that reports no boot ID has no kubelet behind it: it cannot be this host's, which
    runs the kubelet this process serves. Where this host's boot ID cannot be read, only the machine ID is compared.
    The Node's fields are tenant-reachable text (whoever may write Nodes): quoted and cut to 64 characters; machine
    IDs are never quoted (T222)."""
    info = node_info if isinstance(node_info, Mapping) else {}
    fix = "set --node-name to this node's name (a DaemonSet's spec.nodeName: " + (
        f"the node whose status.nodeInfo.bootID is {host.boot_id!r})" if host.boot_id else "this host's node)"
    )
    for field_name, label, ours, where in (
        ("bootID", "boot ID", host.boot_id, str(BOOT_ID)),
        ("machineID", "machine ID", host.machine_id, host.machine_id_file),
    ):
        theirs = info.get(field_name)
        theirs = theirs.strip()[:64] if isinstance(theirs, str) else ""
        if not ours:
            continue
        if not theirs and field_name == "bootID":
            return f"--node-name {node!r} names a node that reports no boot ID: no kubelet runs it; {fix}"
        if theirs and theirs != ours and field_name == "bootID":
            return (
                f"--node-name {node!r} names a node whose kubelet runs on another host: its {label} is {theirs!r}, "
                f"this host's is {ours!r} ({where}); {fix}"
            )
        if theirs and theirs != ours:
            # Neither ID is quoted: the kubelet shows an Allocate refusal to the pod it could not admit (its status
            # message), and a host's machine ID is to be kept from its tenants, who cannot read it (T222); its boot
            # ID any container here reads. The boot ID matched, or was unknown: the machine ID read may be the
            # device plugin's container's own, not the host's.
            return (
                f"--node-name {node!r} names a node whose kubelet runs on another host: its machine ID "
                f"(status.nodeInfo.machineID) is not this host's ({where}); {fix}; or, run in a container, "
                "--host-root to where the host's / is"
            )
    return None


class NodeCheck:
    """Whether `--node-name` is this host's Node (`wrong_node`), asked of the API server before each listing of its
    pods is believed: one GET until it matches, then kept; again whenever the node lists no pod (a name no node has
    lists none either: T199). `confirm` raises `ConnectionError` with the reason, as a listing that failed."""

    def __init__(self, client: Any, node: str, host: HostIdentity) -> None:
        self.client = client
        self.node = node
        self.host = host
        self.confirmed = False

    def confirm(self, *, again: bool = False) -> None:
        from kubegpu.kube.client import ApiError

        if self.confirmed and not again:
            return
        try:
            found = self.client.get(f"/api/v1/nodes/{self.node}")
        except ApiError as exc:
            if exc.status == 404:
                raise ConnectionError(
                    f"the API server knows no node {self.node!r}: --node-name must be this node's name as registered "
                    "(a DaemonSet's spec.nodeName)"
                ) from None
            raise ConnectionError(f"reading node {self.node}: {exc}") from None
        status = found.get("status") if isinstance(found, Mapping) else None
        problem = wrong_node(self.node, status.get("nodeInfo") if isinstance(status, Mapping) else None, self.host)
        if problem is not None:
            self.confirmed = False
            raise ConnectionError(problem)
        self.confirmed = True


def _read_id(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()[:64]
    except OSError:
        return ""


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def _listed_uids(pods: Any) -> frozenset[str] | None:
    """The UIDs of the API server's pod listing; None when an item is no pod with a UID: that item could be any pod
    of the node, so the listing cannot say which are gone."""
    uids = set()
    for pod in pods:
        metadata = pod.get("metadata") if isinstance(pod, dict) else None
        uid = metadata.get("uid") if isinstance(metadata, dict) else None
        if not isinstance(uid, str) or not uid:
            return None
        uids.add(uid)
    return frozenset(uids)


def _summary(ids: Mapping[str, Mapping[str, bool]]) -> str:
    return " ".join(f"{r}={sum(v.values())}/{len(v)}" for r, v in sorted(ids.items()))


# ---------------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------------


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-name", required=True, help="this node's name, as allocations name it")
    parser.add_argument("--allocation-key-file", required=True, help="HMAC key shared with the kubegpu scheduler")
    add_verify_key_argument(parser)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.add_argument(
        "--host-root", type=Path, default=Path("/"), help="where discovery looks and the machine ID is read (default /)"
    )
    parser.add_argument("--dev-root", type=Path, default=Path("/dev"), help="host device files (default /dev)")
    parser.add_argument(
        "--device-plugin-dir", type=Path, default=Path(DEFAULT_DIR), help=f"the kubelet's (default {DEFAULT_DIR})"
    )
    parser.add_argument(
        "--interval", type=parse_interval, default=parse_interval("10s"), help="discovery interval (default 10s)"
    )
    parser.add_argument(
        "--foreign-pods",
        choices=["refuse", "allow"],
        default="refuse",
        help="pods without a verified kubegpu allocation: refuse their admission (default), or allow them the ids "
        "the kubelet chose, whole devices only, never GPU share slots (see the module documentation)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def add_device_plugin_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "device-plugin", help="a Kubernetes device plugin that hands out kubegpu allocations", description=DESCRIPTION
    )
    _add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from kubegpu.core.process import configure_logging, read_key, read_verify_keys
    from kubegpu.kube.client import ApiError, KubeClient

    configure_logging(args.log_level)
    key = read_key(args.allocation_key_file)
    verify_keys = read_verify_keys(args.allocation_verify_key_file, key)
    plugins = make_plugin_manager("device")
    for failure in plugins.failures:
        log.error("%s", failure)
    client = KubeClient.from_kubeconfig(args.kubeconfig, connections=2, timeout=5.0)
    node = NodeCheck(client, args.node_name, HostIdentity.read(args.host_root))

    def list_pods() -> list[dict[str, Any]]:
        node.confirm()  # another node's pods would count this node's as gone (T217)
        try:
            items, _ = client.list("/api/v1/pods", fieldSelector=f"spec.nodeName={args.node_name}")
        except ApiError as exc:
            raise ConnectionError(f"listing the pods of node {args.node_name}: {exc}") from None
        if not items:  # also what a --node-name naming no node gets: every running pod would count as gone
            node.confirm(again=True)
        return items

    pods = PendingPods(list_pods, args.node_name, key, verify_keys=verify_keys)
    service = DevicePluginService(
        plugins,
        pods,
        directory=args.device_plugin_dir,
        host_root=args.host_root,
        dev_root=args.dev_root,
        interval=args.interval,
        foreign_pods=args.foreign_pods,
    )
    stop = threading.Event()

    def terminate(signum: int, _frame: Any) -> None:
        log.info("received signal %d, shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    try:
        node.confirm()
    except ConnectionError as exc:  # said at once; checked again before each listing (the kubelet may be late)
        log.error("%s", exc)
    service.start()
    log.info(
        "kubegpu device-plugin for node %s in %s: %s",
        args.node_name,
        args.device_plugin_dir,
        _summary(service.inventory.ids) or "no devices",
    )
    stop.wait()
    service.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kubegpu device-plugin", description=DESCRIPTION)
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
