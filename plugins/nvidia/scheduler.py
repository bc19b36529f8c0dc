"""The nvidia plugin, scheduler side (DeviceScheduler hooks): whole NVIDIA GPUs, `nvidia.com/gpu: n`.

What a node has comes from the advertised inventory `node.inventories["nvidia"]` when the advertiser runs
(device ids `"0"`.., model, memory in bytes, health, and a topology in the format
`topology.tree_from_inventory` documents), otherwise from NVIDIA GPU Feature Discovery labels:
`nvidia.com/gpu.count` (capped by allocatable `nvidia.com/gpu`, which is also the fallback),
`nvidia.com/gpu.product` and `nvidia.com/gpu.memory` (MiB), otherwise, on a node HAMi's device plugin runs on
without GFD, from HAMi's registration (`hami.io/node-nvidia-register`, `kubegpu.plugins.nvidia.hami`): each
physical GPU's memory, model and health, and the split count (`state_from_registration`); where both are there and
agree on the count, GFD's labels give model and memory and the registration each GPU's health, and where they
disagree GFD's labels alone are read and a log line says so (`read_hami`). A registration kubegpu cannot read, or
whose handshake HAMi would hold stale, is left unread, with a log line saying why; the engine reads both as the
plugin's `kubegpu_scheduler_node_digest` (nodes that differ in them are not one class). The instance type
(`node.kubernetes.io/instance-type`) looks the node up in `topology.CATALOG` for its group tree (DGX-1
cube-mesh, NVSwitch) and for default model and memory; an unknown instance type, or one whose GPU count does
not match the node's, is flat: any set of GPUs is as good as any other.

What a pod asks: `nvidia.com/gpu: n` per container; the pod annotation `nvidia-gpu-scheduler/gpu.model`
restricts every container to GPUs of that model (compared by `topology.normalize_model`: trimmed,
case-insensitive, spaces, `-` and `_` alike); HAMi's `nvidia.com/use-gputype` and `nvidia.com/nouse-gputype`, as HAMi
reads them, to GPUs whose model contains one of the comma-separated types, or none of them (`A100` takes
`NVIDIA A100-SXM4-80GB`; compared as normalized, so GFD's `NVIDIA-A100-SXM4-80GB` matches `NVIDIA A100` too; a GPU
of unknown model matches neither, as it cannot be shown to be, or not to be, of a type); `kubegpu.io/gpu-memory`
(a quantity, e.g. `32Gi`) to GPUs with at least that much memory (a GPU whose memory is unknown does not qualify).
Unhealthy GPUs are never given out.

Which GPUs: `topology.choose`, container by container in spec order, each from what the previous ones left.
The score is the GPU-weighted mean of `topology.placement_score` over the containers (100: every container
inside the smallest group that can hold it). Fit itself needs no placement: any count of free eligible GPUs
can be placed.

The books are the plugin kit's (`kubegpu.core.kit`): `NvidiaNodeState` is a `SharedDeviceNodeState` (GPUs held whole
or shared by compute and memory), with the MIG devices' books beside it, and `NvidiaPlugin` a `DevicePlugin`, whose
take, release, headroom and describe hooks are the kit's; the entry point names its instance, `plugin`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from bisect import bisect_right
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from types import MappingProxyType

from kubegpu.core.kit import Claim, DevicePlugin, SharedDeviceNodeState
from kubegpu.core.limits import check_device_count
from kubegpu.core.models import (
    ContainerRequest,
    DeviceCell,
    DeviceInfo,
    DeviceInventory,
    InitStep,
    NodeInfo,
    Occupancy,
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.quantity import QuantityError, to_int
from kubegpu.core.scheduler_hooks import SETTINGS_KEY, ProfileSettings, hookimpl
from kubegpu.core.status import Status
from kubegpu.core.text import safe_text
from kubegpu.plugins.nvidia import COUNT_LABEL, MEMORY_LABEL, NAME, PRODUCT_LABEL, RESOURCE, hami, mig
from kubegpu.plugins.nvidia.mig import MIG_PREFIX, MIG_RESOURCES, MigBooks, profile_of, resource_of
from kubegpu.plugins.nvidia.sharing import (
    ANY_CPU,
    CORES,
    MAX_KIND_MODELS,
    MEASURES_REMEMBERED,
    MEMORY,
    MEMORY_PERCENT,
    SHARE_RESOURCES,
    WHOLE,
    FragmentationTable,
    Models,
    Share,
    ShareError,
    Workload,
    fragmentation_delta,
    node_fragmentation,
    read_share,
)
from kubegpu.plugins.nvidia.topology import (
    CATALOG,
    CUBE_MESH,
    FLAT,
    NVSWITCH,
    GroupTree,
    InstanceType,
    TopologyError,
    build_tree,
    choose,
    ids_of,
    link_pairs,
    normalize_model,
    placement_score,
    tree_from_inventory,
)

__all__ = ["NAME", "RESOURCE", "RESOURCES", "NvidiaNodeState", "NvidiaPodState", "parse_ask", "read_ask"]

RESOURCES = [RESOURCE, *SHARE_RESOURCES, *MIG_RESOURCES]
MIG_OWNED = frozenset(MIG_RESOURCES)
# The nodes `kubegpu plugins check` runs the conformance suite on: whole GPUs and shares, as the suite generates them
# (1-8 of each resource). Not MIG devices: the node side gives one only where NVML lists it, which a conformance run
# has not (tests/plugins/test_nvidia_mig.py and the shim's test hold MIG instead).
conformance_nodes = [
    {
        "kind": "Node",
        "metadata": {"name": f"conformance-{n}", "labels": {f"{resource}.count": str(count)}},
        "status": {"allocatable": {"cpu": "96", "memory": "768Gi", "pods": "110", resource: str(count)}},
    }
    for n, (resource, count) in enumerate((r, c) for r in (RESOURCE, *SHARE_RESOURCES) for c in (1, 2, 4, 8))
]
# The per-GPU books count the share resources: a node need not list them (HAMi's device plugin lists only
# nvidia.com/gpu; the kubelet admits requests for extended resources its node does not list).
UNLISTED = frozenset(SHARE_RESOURCES)
POLICY_ENV = "KUBEGPU_NVIDIA_SHARE_POLICY"
POLICIES = ("fgd", "bestfit")
WORKLOAD_KEY = "workload"  # in the engine's `shared` dict: the mix of pods its states took (`Workload`)
BOOK_KEY = "placements"  # in the engine's `shared` dict: the placements its states share (`PlacementBook`)

MODEL_ANNOTATION = "nvidia-gpu-scheduler/gpu.model"
# HAMi's per-pod GPU type filters, kept so that tenants' HAMi manifests keep landing on the GPUs they name: HAMi
# compares each comma-separated type as a case-insensitive substring of the GPU's model.
USE_TYPE_ANNOTATION = "nvidia.com/use-gputype"
NOUSE_TYPE_ANNOTATION = "nvidia.com/nouse-gputype"
# HAMi's per-pod GPU picks by UUID: kubegpu keeps no GPU's UUID in its books, so it refuses a pod naming one rather
# than place it on GPUs it did not name (or on the one it excluded).
UUID_ANNOTATIONS = ("nvidia.com/use-gpuuuid", "nvidia.com/nouse-gpuuuid")
MAX_GPU_TYPES = 64  # types one annotation may list: matching costs types x GPUs per node and pod shape
MAX_GPU_TYPE_CHARS = 256
MEMORY_ANNOTATION = "kubegpu.io/gpu-memory"
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")

INSUFFICIENT = f"Insufficient {RESOURCE}"
MIB = 1024 * 1024

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------
# Private state
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NvidiaPodState:
    """The nvidia part of one pod: GPU counts per requesting container (spec order), pod-wide refinements.

    `error` is set when an annotation is malformed; `model` and `memory_text` are kept as written (trimmed)
    for reasons, `model_key` and `memory` are what is compared.
    """

    containers: tuple[tuple[str, int], ...] = ()
    total: int = 0
    shares: tuple[Share, ...] = ()
    model: str | None = None
    model_key: str | None = None
    memory: int | None = None
    memory_text: str | None = None
    error: str | None = None
    mig: tuple[tuple[str, str, int], ...] = ()  # (container, MIG profile, count) for `nvidia.com/mig-<profile>`
    use_types: tuple[str, ...] = ()  # `nvidia.com/use-gputype`, normalized: the GPU's model contains one
    nouse_types: tuple[str, ...] = ()  # `nvidia.com/nouse-gputype`, normalized: the GPU's model contains none
    types_text: tuple[str, str] = ("", "")  # both annotations as written (trimmed): the reasons quote them


Plan = tuple[tuple[str, int, int, int], ...]
"""Per container: (name, GPU count, chosen mask, size of the group the GPUs lie in)."""

SharePlan = tuple[tuple[Share, tuple[int, ...], int, tuple[int, ...]], ...]
"""Per share container: (its share, the GPU positions chosen, cores per GPU, memory on each chosen GPU in the GPU's
unit: MiB, or percent where the GPU's memory is unknown)."""


@dataclass(frozen=True, slots=True)
class NvidiaPlacement:
    """A pod's GPUs on one node: whole containers (`whole`), share containers (`shares`), and the score; `by_mix`:
    whether the mix of pods chose among GPUs that would leave the node otherwise (fgd, a share with GPUs of two
    kinds of room to choose from), so that another mix may place it otherwise."""

    whole: Plan
    shares: SharePlan
    score: float
    by_mix: bool = field(default=False, compare=False)


_MISSING = object()
STEADY = frozenset({"fit", "score", "place"})  # `PlacementBook`'s answers kept across versions where no mix decides


class PlacementBook:
    """The placements (`place`) and fit answers (`kubegpu_scheduler_fit`) the nvidia states of one engine share:
    nodes whose GPUs are alike in all that `place` and the fit read of them (`NvidiaNodeState.content`) get the same
    answers for the same ask, so a cycle that scores every node places a pod once per distinct GPU state, not once
    per node.

    Key: (the state's content number, the ask), the ask by identity (the engine hands the same prepared ask to every
    node in a cycle) and else by equality. Valid for one version of one mix (`Workload`: the fgd policy ranks GPUs
    against it): dropped all at once when the mix or its version differs from the one the entries were made under,
    or past `LIMIT` answers; but the fit answers and the scores (`kubegpu_scheduler_score`), which no mix decides
    (whether `place` finds GPUs: the mix ranks only a lone share container's GPUs, never which fit; the score: the
    whole containers' topology, or under `bestfit`, which reads no mix, how full the GPUs end up), and the
    placements that no mix chose (`NvidiaPlacement.by_mix` false, or none) are kept apart (`steady`), across mix
    versions, until past `LIMIT`. The engine keeps a node's fit answer per node content across the mix's moves
    too (`check`'s memo, `ShapeAnswers`). Content numbers
    are never reused (`serial`), so a state's remembered number stays its content's even after `contents` is dropped
    (past `LIMIT`)."""

    LIMIT = 1 << 16

    __slots__ = ("answers", "contents", "serial", "size", "stamp", "steady", "steady_size")

    def __init__(self) -> None:
        self.contents: dict[tuple[object, ...], int] = {}
        # (what: "place" or "fit", id(ask)) -> (ask, {content number: the answer})
        self.answers: dict[tuple[str, int], tuple[NvidiaPodState, dict[int, object]]] = {}
        # The same for the fit answers, the scores and the placements no mix decides, whatever the mix's version.
        self.steady: dict[tuple[str, int], tuple[NvidiaPodState, dict[int, object]]] = {}
        self.steady_size = 0
        self.serial = 0
        self.stamp: tuple[int, int] = (0, -1)  # (id of the mix, its version) the answers were made under
        self.size = 0

    def number(self, content: tuple[object, ...]) -> int:
        known = self.contents.get(content)
        if known is None:
            if len(self.contents) >= self.LIMIT:
                self.contents.clear()
            self.serial += 1
            known = self.contents[content] = self.serial
        return known

    def get(self, what: str, workload: Workload, number: int, ask: NvidiaPodState) -> object:
        """The answer remembered, or `_MISSING`."""
        if what in STEADY:
            entry = self.steady.get((what, id(ask)))
            found = _MISSING
            if entry is not None and (entry[0] is ask or entry[0] == ask):
                found = entry[1].get(number, _MISSING)
            if found is not _MISSING or what != "place":
                return found
        if self.stamp != (id(workload), workload.version):
            return _MISSING
        entry = self.answers.get((what, id(ask)))
        if entry is None or not (entry[0] is ask or entry[0] == ask):
            return _MISSING
        return entry[1].get(number, _MISSING)

    def put(self, what: str, workload: Workload, number: int, ask: NvidiaPodState, answer: object) -> None:
        by_mix = isinstance(answer, NvidiaPlacement) and answer.by_mix
        if what in STEADY and not by_mix:
            if self.steady_size >= self.LIMIT:
                self.steady.clear()
                self.steady_size = 0
            entry = self.steady.get((what, id(ask)))
            if entry is None or entry[0] is not ask:
                entry = self.steady[what, id(ask)] = (ask, {})
            entry[1][number] = answer
            self.steady_size += 1
            return
        stamp = (id(workload), workload.version)
        if self.stamp != stamp or self.size >= self.LIMIT:
            self.answers.clear()
            self.stamp, self.size = stamp, 0
        key = (what, id(ask))
        entry = self.answers.get(key)
        if entry is None or entry[0] is not ask:
            entry = self.answers[key] = (ask, {})
        entry[1][number] = answer
        self.size += 1


class NvidiaNodeState(SharedDeviceNodeState):
    """One node's GPUs on the plugin kit's books (`kubegpu.core.kit.SharedDeviceNodeState`): GPU i (in id order) is
    bit i of the masks, `holders[i]` holds it whole; shares take compute (percent) and memory (MiB, or percent where
    the GPU's memory is unknown: `memory_cap`), at most `split` of them per GPU on a node that offers shares
    (`offers_shares`); `free` holds healthy GPUs nobody holds whole and nobody shares. MIG-enabled GPUs are apart,
    in `mig`."""

    plugin = NAME
    noun = "GPU"

    def __init__(
        self,
        node: str,
        ids: list[str],
        models: list[str | None],
        memories: list[int | None],
        healthy: list[bool],
        tree: GroupTree,
        split: int = 1,
        workload: Workload | None = None,
        offers_shares: bool = True,
    ) -> None:
        # Less than a MiB is no GPU's memory (GFD's `nvidia.com/gpu.memory: "0"`, a failed NVML read): unknown, so
        # shares take it in percent rather than MiB of nothing (each share 0 MiB of 0, every share fitting).
        memories = [m if m is not None and m >= MIB else None for m in memories]
        memory_known = tuple(m is not None for m in memories)
        memory_cap = tuple(100 if m is None else m // MIB for m in memories)
        compute = ("compute", [100] * len(ids), ["%"] * len(ids))
        memory = ("memory", memory_cap, ["MiB" if known else "%" for known in memory_known])
        super().__init__(NAME, node, ids, healthy, (compute, memory), split, extra=tree)
        self.models = tuple(models)
        self.model_keys = tuple(None if m is None else normalize_model(m) for m in models)
        self.gpu_models = frozenset(key for key in self.model_keys if key is not None)
        self.memories = tuple(memories)
        self.tree = tree
        self.memory_known = memory_known
        self.memory_cap = memory_cap
        # Whether the node takes shares at all: a node of whole GPUs (NVIDIA's device plugin, or kubegpu's advertiser
        # where the node enforces no shares) refuses a share container on the node, so none is placed there.
        self.offers_shares = offers_shares
        self.cores_used, self.memory_used = self.used  # the kit's books, by the names the rules below read
        self.policy = os.environ.get(POLICY_ENV, "fgd").strip().lower()
        # The mix of pods the engine's states took, shared by them (a state built without an engine learns alone).
        self.workload = workload if workload is not None else Workload()
        self.mig: MigBooks | None = None  # the node's MIG-enabled GPUs, apart from the GPUs above (`mig.py`)
        self._free: tuple[int, tuple[int, ...]] | None = None
        self._eligible: dict[tuple[str | None, str | None, str, str], tuple[int, str | None]] = {}
        self._plan: tuple[tuple[int, int], NvidiaPodState, NvidiaPlacement | None] | None = None
        self.book = PlacementBook()  # shared with the engine's other states (`kubegpu_scheduler_build_node`)
        self._content: tuple[int, str, int] | None = None  # (version, policy, content number)

    def fragmentation_table(self) -> FragmentationTable:
        """The engine's mix as the measure reads it on this node (kinds barred from its GPU models apart)."""
        return self.workload.table(self.gpu_models)

    def eligible(self, ask: NvidiaPodState) -> tuple[int, str | None]:
        """(healthy GPUs of the asked model and memory, the unresolvable reason when the node has none)."""
        key = (ask.model, ask.memory_text, *ask.types_text)  # as written: the reason quotes them
        cached = self._eligible.get(key)
        if cached is None:
            if len(self._eligible) >= 64:
                self._eligible.clear()
            cached = self._eligible[key] = eligible_gpus(self, ask)
        return cached

    def plan(self, ask: NvidiaPodState) -> NvidiaPlacement | None:
        """The placement for the ask on the current state, computed once per (state version, mix version, ask)."""
        stamp = (self.version, self.workload.version)
        cached = self._plan
        if cached is not None and cached[0] == stamp and cached[1] == ask:
            return cached[2]
        book, workload = self.book, self.workload
        number = self.content()
        result = book.get("place", workload, number, ask)
        if result is _MISSING:
            mask, reason = self.eligible(ask)
            result = None if reason else place(self, mask, ask)
            book.put("place", workload, number, ask, result)
        self._plan = (stamp, ask, result)  # type: ignore[assignment]  # not _MISSING: computed above
        return result  # type: ignore[return-value]

    def scoring_content(self) -> tuple[object, ...]:
        """What the engine's local scores read of this state (`Scoring.scoring_content`): `content`, which covers
        the placement, `free_millis` and the headroom's utilization, and the MIG books' by value where there are
        some (`MigBooks.content`: MIG nodes alike share their answers, and a node's changes with its devices held)."""
        return (self.content(), None if self.mig is None else self.mig.content())

    def content(self) -> int:
        """The number of what `place` (and `eligible`) read of this state, in its `book`: equal numbers, equal
        placements for equal asks under one mix version. Remembered per state version and policy. A change to
        `place` that reads more of the state must add it here (tests/plugins/test_nvidia_placement_book.py)."""
        cached = self._content
        if cached is not None and cached[0] == self.version and cached[1] == self.policy:
            return cached[2]
        content = (
            self.ids,  # the fit's reasons name GPUs
            self.model_keys,
            self.memories,
            self.memory_cap,
            self.memory_known,
            self.healthy,
            self.free,
            tuple(holder is None for holder in self.holders),
            tuple(self.tasks),
            tuple(self.cores_used),
            tuple(self.memory_used),
            self.split,
            self.offers_shares,
            self.policy,
            self.tree,
        )
        number = self.book.number(content)
        self._content = (self.version, self.policy, number)
        return number

    def free_millis(self) -> tuple[int, ...]:
        """`free_milli` of every GPU, remembered per state version."""
        cached = self._free
        if cached is None or cached[0] != self.version:
            cached = self._free = (self.version, tuple(self.free_milli(bit) for bit in range(len(self.ids))))
        return cached[1]

    def cannot_take(self, claim: Claim) -> str | None:
        books = self.mig
        taken = next((d for d in claim.extra or () if books is not None and d in books.holders), None)
        if taken is not None and books is not None:
            return f"MIG device {taken} is already held by {books.holders[taken]}"
        return super().cannot_take(claim)

    def take(self, pod_key: str, claim: Claim) -> None:
        """The kit's books, and the MIG devices the claim names (`Claim.extra`, read from `mig`)."""
        super().take(pod_key, claim)
        if self.mig is not None and claim.extra:
            self.mig.holders.update(dict.fromkeys(claim.extra, pod_key))

    def give_back(self, pod_key: str, claim: Claim) -> None:
        super().give_back(pod_key, claim)
        books = self.mig
        if books is None:
            return
        # On nominal books the ids read now may stand for other devices than those read when the pod was held
        # (`MigBooks.read`): what the pod holds is given back, as a pod holds one allocation per node.
        held = [d for d, holder in books.holders.items() if holder == pod_key] if books.nominal else claim.extra or ()
        for device in held:
            if books.holders.get(device) == pod_key:  # idempotent, as the kit's
                del books.holders[device]

    def memory_of(self, share: Share, bit: int) -> int | None:
        """The share's memory on GPU `bit` in the GPU's unit, None when it cannot be told (MiB of unknown memory)."""
        if share.memory_percent is not None:
            cap = self.memory_cap[bit]
            return cap * share.memory_percent // 100 if self.memory_known[bit] else share.memory_percent
        return share.memory_mib if self.memory_known[bit] else None


# ----------------------------------------------------------------------------------------------------------
# Hook implementations
# ----------------------------------------------------------------------------------------------------------


class NvidiaPlugin(DevicePlugin[NvidiaNodeState]):
    """The nvidia plugin on the kit: the kit keeps the books (take, release, headroom, describe over
    `SharedDeviceNodeState`); this class says where a node's GPUs come from, reads a pod's ask, places it (`place`,
    `fit_answer`) and reads an allocation back into the books (`claimed`: whole GPUs, shares, MIG devices)."""

    name = NAME
    resources = tuple(RESOURCES)
    family = NAME
    unlisted = UNLISTED
    # A share's compute and memory are amounts of each GPU it asks: an init container asking a share of the app's
    # whole GPU holds no compute of its own, and is given its share of that GPU (`kubegpu.core.manifests`).
    qualifiers = MappingProxyType(dict.fromkeys(SHARE_RESOURCES, RESOURCE))
    conformance_nodes = conformance_nodes  # the nodes `kubegpu plugins check` runs its suite on (above)

    # -- the books: what the kit's hooks ask ---------------------------------------------------------------------

    def claimed(self, state: NvidiaNodeState, allocation: PluginAllocation) -> Claim | str:
        """Whole GPUs, shares (compute, memory in the GPU's unit) and MIG devices (`Claim.extra`)."""
        allocation, devices = split_mig(state, allocation)
        if isinstance(devices, str):
            return devices
        read = read_allocation(state, allocation)
        if isinstance(read, str):
            return read
        bits, parts = read
        return Claim(bits, [(bit, (cores, memory)) for bit, cores, memory in parts], extra=devices)

    def learn(self, state: NvidiaNodeState, allocation: PluginAllocation, pod: PodRequest | None, claim: Claim) -> None:
        """The kinds of the pod's containers (GPUs, thousandths of each, the pod's cpu, and where the profile asks
        for it (`Workload.models`) the GPU models it may use) join the engine's mix."""
        cpu = pod.cpu_milli if pod is not None else 0
        models = pod_gpu_models(pod) if pod is not None and state.workload.models else None
        if claim.whole:
            state.workload.add((len(claim.whole), WHOLE, cpu, models))
        if claim.shares:
            for gpus, milli in share_kinds(state, allocation):
                state.workload.add((gpus, milli, cpu, models))

    def headroom_free(self, state: NvidiaNodeState) -> dict[str, int]:
        shareable = [bit for bit in range(len(state.ids)) if state.shareable(bit)]
        shared = shareable if state.offers_shares else []  # a node of whole GPUs has no share to offer
        return {
            RESOURCE: len(shareable),
            CORES: state.most_free(0, shared),
            MEMORY: state.most_free(1, [bit for bit in shared if state.memory_known[bit]]),
            MEMORY_PERCENT: state.most_free(1, shared, percent=True),
            **(state.mig.free_counts() if state.mig is not None else {}),
        }

    def picture(self, state: NvidiaNodeState) -> dict[str, object]:
        """A DGX-1 cube-mesh as a 4x4 grid (two rows of four), the links of the tree."""
        grid = state.tree.kind == CUBE_MESH and len(state.ids) == 8
        return {
            "layout": "grid" if grid else "cells",
            "columns": 4 if grid else 0,
            "topology": state.tree.kind if state.tree.kind in (CUBE_MESH, NVSWITCH) else "",
            "links": list(link_pairs(state.tree)),
        }

    def more_occupancy(self, state: NvidiaNodeState) -> list[Occupancy]:
        """One cell per MIG device: "GPU@start profile"."""
        books = state.mig
        if books is None:
            return []
        cells = [
            DeviceCell(
                id=f"{device} {instance.profile}",
                holders=[holder] if (holder := books.holders.get(device)) else [],
                used=1.0 if holder else 0.0,
            )
            for device, instance in books.devices.items()
        ]
        unheld = len(books.devices) - len(books.holders)
        return [Occupancy(family=f"{NAME}-mig", cells=cells, total=len(cells), free=unheld, largest_fit=unheld)]

    # -- deciding: the pod's ask, its placement ------------------------------------------------------------------

    @hookimpl
    def kubegpu_scheduler_build_node(self, node: NodeInfo, shared: dict[str, object] | None) -> NvidiaNodeState | None:
        settings = shared.get(SETTINGS_KEY) if shared is not None else None
        if not isinstance(settings, ProfileSettings):
            settings = ProfileSettings()
        workload = shared.get(WORKLOAD_KEY) if shared is not None else None
        if shared is not None and not isinstance(workload, Workload):
            workload = shared[WORKLOAD_KEY] = (
                Workload.configured(settings.mix) if settings.mix else Workload(models=settings.model_access)
            )
        inventory = node.inventories.get(NAME)
        if inventory is not None:
            inventory, books = mig.books_from_inventory(node.name, inventory)
            state = state_from_inventory(node.name, inventory, instance_type(node.labels), node.allocatable)
        else:
            books = mig.books_from_labels(node.name, node.labels, node.allocatable)
            registered, note = read_hami(node.name, node.labels, node.allocatable, node.annotations)
            report_hami(node.name, note, shared)
            state = state_from_labels(node.name, node.labels, node.allocatable, registered)
        if books is not None:
            state = state or NvidiaNodeState(node.name, [], [], [], [], catalog_tree(None, 1))  # every GPU MIG-enabled
            state.mig = books
        if state is not None and isinstance(workload, Workload):
            state.workload = workload
        if state is not None and shared is not None:
            book = shared.get(BOOK_KEY)
            if not isinstance(book, PlacementBook):
                book = shared[BOOK_KEY] = PlacementBook()
            state.book = book
        if state is not None and settings.share_policy:
            state.policy = settings.share_policy
        return state

    @hookimpl
    def kubegpu_scheduler_node_digest(self, node: NodeInfo) -> Hashable | None:
        # Beyond labels and allocatable, `build_node` reads HAMi's registration, where no inventory is advertised:
        # its text and whether the handshake is stale, not the handshake's every rewrite (`registration_digest`).
        if NAME in node.inventories or hami.REGISTER_KEY not in node.annotations:
            return None
        return hami.registration_digest(node.annotations, datetime.now(timezone.utc))

    @hookimpl
    def kubegpu_scheduler_validate(self, pod: PodRequest) -> Status | None:
        error = read_ask(pod).error
        return Status.unresolvable(error, plugin=NAME) if error else None

    @hookimpl
    def kubegpu_scheduler_prepare(self, pod: PodRequest) -> NvidiaPodState:
        return read_ask(pod)

    @hookimpl
    def kubegpu_scheduler_fit(self, state: NvidiaNodeState, pod: PodRequest, prepared: NvidiaPodState) -> Status:
        ask = prepared
        if ask.mig or ask.error:  # MIG books are not in the state's content
            return fit_answer(state, ask)
        number = state.content()
        answer = state.book.get("fit", state.workload, number, ask)
        if answer is _MISSING:
            answer = fit_answer(state, ask)
            state.book.put("fit", state.workload, number, ask, answer)
        return answer  # type: ignore[return-value]  # a Status put above

    @hookimpl
    def kubegpu_scheduler_score(self, state: NvidiaNodeState, pod: PodRequest, prepared: NvidiaPodState) -> float:
        ask = prepared
        if ask.error or not (ask.total or ask.shares):
            return 0.0 if ask.error else 100.0
        if ask.mig:  # MIG books are not in the state's content
            plan = state.plan(ask)
            return 0.0 if plan is None else plan.score
        number = state.content()
        score = state.book.get("score", state.workload, number, ask)
        if score is _MISSING:
            plan = state.plan(ask)
            score = 0.0 if plan is None else plan.score
            state.book.put("score", state.workload, number, ask, score)
        return score  # type: ignore[return-value]  # a float put above

    @hookimpl
    def kubegpu_scheduler_fragmentation(
        self, state: NvidiaNodeState, pod: PodRequest, prepared: NvidiaPodState | None, free: Mapping[str, int]
    ) -> float | None:
        table = state.fragmentation_table()
        if not table.weight:
            return None
        cpu = free.get("cpu", ANY_CPU)
        ask = prepared
        gpus = ask is not None and bool(ask.total or ask.shares)
        if gpus and ask is not None and ask.error:
            return None
        # The answer reads the state's content (its free GPUs and the placement: `place`), the ask, and of the cpu
        # only which of the table's kinds it holds before and after (`_measure`): remembered per table so.
        cpus, asked = table.cpus, ask if gpus else None
        key = (
            state.content(),
            id(asked) if gpus else 0,
            bisect_right(cpus, cpu),
            bisect_right(cpus, cpu - pod.cpu_milli),
        )
        deltas = table.deltas
        known = deltas.get(key)
        if known is not None and known[0] is asked:
            return known[1]
        if len(deltas) >= MEASURES_REMEMBERED:
            deltas.clear()
        answer = deltas[key] = (asked, fragmentation_grown(state, pod, asked, table, cpu))
        return answer[1]

    @hookimpl
    def kubegpu_scheduler_fragmentation_epoch(self, shared: dict[str, object]) -> int | None:
        workload = shared.get(WORKLOAD_KEY)
        return workload.version if isinstance(workload, Workload) else None

    @hookimpl
    def kubegpu_scheduler_allocate(
        self, state: NvidiaNodeState, pod: PodRequest, prepared: NvidiaPodState
    ) -> PluginAllocation | None:
        s, ask = state, prepared
        if ask.error:
            return None
        plan = s.plan(ask) if ask.total or ask.shares else NvidiaPlacement((), (), 100.0)
        if plan is None:
            return None
        chosen = 0
        containers: dict[str, dict[str, list[str]]] = {}
        if ask.mig:
            devices = s.mig.plan(ask.mig) if s.mig is not None else None
            if devices is None:
                return None
            for container, resource, ids in devices:
                containers.setdefault(container, {})[resource] = ids
        shares: dict[str, dict[str, dict[str, int]]] = {}
        for name, _, mask, _ in plan.whole:
            containers[name] = {RESOURCE: ids_of(mask, s.ids)}
            chosen |= mask
        for share, bits, cores, memories in plan.shares:
            ids = [s.ids[bit] for bit in bits]
            memory_resource = MEMORY if all(s.memory_known[bit] for bit in bits) else MEMORY_PERCENT
            if memory_resource == MEMORY_PERCENT:  # a mixed or unknown node: percent of each GPU, as asked
                memories = tuple(share.memory_percent or 100 for _ in bits)
            containers[share.container] = {RESOURCE: list(ids), CORES: list(ids), memory_resource: list(ids)}
            shares[share.container] = {
                RESOURCE: dict.fromkeys(ids, 1),
                CORES: dict.fromkeys(ids, cores),
                memory_resource: dict(zip(ids, memories, strict=True)),
            }
            chosen |= sum(1 << bit for bit in bits)
        models = {s.models[bit] for bit in range(len(s.ids)) if chosen >> bit & 1}
        fields = {"model": models.pop()} if len(models) == 1 and None not in models else {}
        return PluginAllocation(plugin=NAME, containers=containers, shares=shares, fields=fields)


def fit_answer(s: NvidiaNodeState, ask: NvidiaPodState) -> Status:
    """`kubegpu_scheduler_fit` computed (the hook shares the answers of nodes alike: `PlacementBook`)."""
    if ask.error:
        return Status.unresolvable(ask.error, plugin=NAME)
    if ask.mig:
        refused = mig_refusal(s, ask)
        if refused is not None:
            return refused
    if not ask.total and not ask.shares:
        return Status.success()
    mask, reason = s.eligible(ask)
    if reason:
        return Status.unresolvable(reason, plugin=NAME)
    if ask.total > mask.bit_count():
        return Status.unresolvable(INSUFFICIENT, plugin=NAME)
    if ask.shares:
        never = share_never_fits(s, mask, ask)
        if never:
            return Status.unresolvable(never, plugin=NAME)
    if ask.total > (mask & s.free).bit_count():
        return Status.unschedulable(INSUFFICIENT, plugin=NAME)
    if ask.shares and not shares_fit(s, mask, ask):
        return Status.unschedulable(share_shortage(s, mask, ask), plugin=NAME)
    return Status.success()


def shares_fit(s: NvidiaNodeState, eligible: int, ask: NvidiaPodState) -> bool:
    """Whether `place` finds GPUs for the ask: for one share container and no whole one, whether enough GPUs have
    room for the share (`place`'s own tests, without ranking them by the mix: a fit answer needs no placement);
    otherwise the placement itself."""
    if ask.containers or len(ask.shares) != 1:
        return s.plan(ask) is not None
    share = ask.shares[0]
    room = 0
    for bit in range(len(s.ids)):
        if eligible >> bit & 1 and s.shareable(bit) and share_room(s, bit, share) is not None:
            room += 1
    return room >= share.count


def share_room(
    state: NvidiaNodeState, bit: int, share: Share, tasks: int = 0, cores: int = 0, memory: int = 0
) -> int | None:
    """The memory (the GPU's unit) the share takes of GPU `bit` where the GPU has room for it beside `tasks` more
    shares, `cores` percent and `memory` more already planned on it (its split count, 100 % of compute, its
    memory); None where it has not, where the node offers no shares, and where the share asks MiB of a GPU whose
    memory is unknown (booked there as all of it, with no memory limit written on the node)."""
    if (
        not state.offers_shares
        or state.tasks[bit] + tasks >= state.split
        or state.cores_used[bit] + cores + share.cores > 100
    ):
        return None
    need = state.memory_of(share, bit)
    if need is None or state.memory_used[bit] + memory + need > state.memory_cap[bit]:
        return None
    return need


# ----------------------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------------------


def owns(resource: str) -> bool:
    return resource in RESOURCES


def mig_refusal(state: NvidiaNodeState, ask: NvidiaPodState) -> Status | None:
    """Why the node cannot give the ask's MIG devices now (unresolvable when it never could), or None."""
    if state.mig is None:
        return Status.unresolvable(f"Insufficient {resource_of(ask.mig[0][1])}", plugin=NAME)
    refused = state.mig.refusal(ask.mig)
    if refused is None:
        return None
    never, reason = refused
    return Status.unresolvable(reason, plugin=NAME) if never else Status.unschedulable(reason, plugin=NAME)


def split_mig(state: NvidiaNodeState, allocation: PluginAllocation) -> tuple[PluginAllocation, list[str] | str]:
    """The allocation without its MIG resources, and the MIG device ids they name (or why they cannot be read on
    this node: a decoded annotation may hold anything)."""
    containers: dict[str, dict[str, list[str]]] = {}
    found: dict[str, dict[str, list[str]]] = {}
    for container, resources in allocation.containers.items():
        for resource, ids in resources.items():
            (found if resource in MIG_OWNED else containers).setdefault(container, {})[resource] = ids
    if not found:
        return allocation, []
    rest = allocation.model_copy(update={"containers": containers})
    if state.mig is None:
        return rest, "the allocation names MIG devices, and this node has none"
    return rest, state.mig.read(found)


ASKS_INTERNED = 4096  # distinct asks `read_ask` keeps one object of; past it, dropped all at once
_asks: dict[NvidiaPodState, NvidiaPodState] = {}


def read_ask(pod: PodRequest) -> NvidiaPodState:
    """The nvidia part of a pod (the engine reads it once per pod signature: `kubegpu_scheduler_prepare`), one
    object per distinct ask: the `PlacementBook` keeps answers by the ask's identity, so pod shapes that differ
    only beside their GPUs (cpu, memory) share their placements and fit answers (openb: 126 shapes, 24 asks)."""
    ask = parse_ask(pod.containers, pod.annotations)
    if pod.init_steps and not ask.error:
        refused = init_refusal(pod.init_steps, ask)
        if refused:
            ask = dataclasses.replace(ask, error=refused)
    known = _asks.get(ask)
    if known is None:
        if len(_asks) >= ASKS_INTERNED:
            _asks.clear()
        known = _asks[ask] = ask
    return known


def init_refusal(steps: Sequence[InitStep], ask: NvidiaPodState) -> str | None:
    """Why the pod cannot give a classic init container the GPUs it asks, or None.

    The kubelet gives the containers after an init container its GPUs, at its own pick among them; kubegpu gives a
    GPU whole or shared. So an init container asking n GPUs is given n of the pod's whole ones (the app's, and what
    it holds beyond them: `kubegpu.core.manifests`), with its share's amounts of each lent where it asks a share, or,
    in a pod holding no GPU whole, the share of a container holding exactly n (`init_devices`). Where the pod holds
    fewer whole GPUs beside shares it would be given none (an empty 2-GPU node took an init container of 2 whole
    GPUs before an app of a 50 % share, and named the init container nothing). An init container's own share is
    read as an app container's is: it may be lent it where no holder read it."""
    for step in steps:
        try:
            read_share(step.name, step.resources)
        except ShareError as exc:
            return f"init {exc}"
    if not ask.shares:
        return None
    whole = sum(count for _, count in ask.containers)
    lenders = {share.count for share in ask.shares}
    for step in steps:
        asked = step.resources.get(RESOURCE, 0)
        if asked <= whole or (not whole and asked in lenders):
            continue
        shared = any(step.resources.get(r, 0) for r in SHARE_RESOURCES)
        what = f"a share of {asked} GPU(s)" if shared else f"{asked} whole GPU(s)"
        beside = ", ".join(sorted({share.container for share in ask.shares} - {step.name}))
        held = f"{whole} GPU(s) whole" + (f" beside the GPU share(s) of {beside}" if beside else "")
        fewer = (
            f"at most {whole} GPU(s) in init container {step.name}"
            if whole or not beside
            else f"in init container {step.name} as many GPUs as a share of {beside} takes (it is then given it)"
        )
        return (
            f"init container {step.name} asks {what}, and the pod holds {held}: the kubelet gives "
            "the containers after an init container its GPUs, at its own pick, and a GPU is given whole or shared, "
            f"not both; ask {fewer}, or whole GPUs in the containers after it"
        )
    return None


def parse_ask(containers: Sequence[ContainerRequest], annotations: Mapping[str, str]) -> NvidiaPodState:
    """`NvidiaPodState` from a pod's containers and annotations."""
    wanted: list[tuple[str, int]] = []
    shares: list[Share] = []
    error = None
    migs: list[tuple[str, str, int]] = []
    for container in containers:
        asked_mig = [(profile_of(r) or r, n) for r, n in container.resources.items() if r in MIG_OWNED and n > 0]
        if asked_mig:
            if any(container.resources.get(r, 0) > 0 for r in (RESOURCE, *SHARE_RESOURCES)):
                error = error or (
                    f"container {container.name} asks {resource_of(asked_mig[0][0])} beside {RESOURCE} or a share; "
                    f"a container gets MIG devices or GPUs, not both"
                )
            migs.extend((container.name, profile, count) for profile, count in sorted(asked_mig))
            continue
        try:
            share = read_share(container.name, container.resources)
        except ShareError as exc:
            error = error or str(exc)
            continue
        if share is not None:
            shares.append(share)
            continue
        amount = container.resources.get(RESOURCE, 0)
        if amount > 0:
            wanted.append((container.name, amount))
    model = (annotations.get(MODEL_ANNOTATION) or "").strip() or None
    memory_text = (annotations.get(MEMORY_ANNOTATION) or "").strip() or None
    memory = None
    if memory_text is not None and error is None:
        try:
            memory = to_int(memory_text)
        except QuantityError as exc:
            error = f"annotation {MEMORY_ANNOTATION}: {exc}"
        else:
            if memory < 0:
                error = f"annotation {MEMORY_ANNOTATION}: {memory_text!r} is negative (give a size: 16Gi)"
    use_text = (annotations.get(USE_TYPE_ANNOTATION) or "").strip()
    nouse_text = (annotations.get(NOUSE_TYPE_ANNOTATION) or "").strip()
    use_types, nouse_types = gpu_types(USE_TYPE_ANNOTATION, use_text), gpu_types(NOUSE_TYPE_ANNOTATION, nouse_text)
    for types in (use_types, nouse_types):
        if isinstance(types, str):
            error = error or types
    if migs and error is None:
        # The MIG books know each GPU's placement table, not its model: a GPU type or model named beside MIG devices
        # would be left unread, and the pod placed on any GPU's MIG device.
        named_types = [a for a in (USE_TYPE_ANNOTATION, NOUSE_TYPE_ANNOTATION, MODEL_ANNOTATION) if annotations.get(a)]
        if named_types:
            error = (
                f"annotation {named_types[0]} does not choose among MIG devices ({resource_of(migs[0][1])}): kubegpu "
                f"would place the pod on a MIG device of any GPU; remove {named_types[0]} and choose the nodes by "
                f"their GPU model (a nodeSelector on {PRODUCT_LABEL})"
            )
    for named in UUID_ANNOTATIONS:
        if named in annotations:
            error = error or (
                f"annotation {named} (HAMi's choice of GPUs by UUID) is not read by kubegpu, which would place the "
                f"pod on GPUs it did not choose; remove {named} (nvidia.com/use-gputype or "
                f"{MODEL_ANNOTATION} choose GPUs by model)"
            )
    return NvidiaPodState(
        containers=tuple(wanted),
        total=sum(n for _, n in wanted),
        shares=tuple(shares),
        model=model,
        model_key=normalize_model(model) if model else None,
        memory=memory,
        memory_text=memory_text,
        error=error,
        mig=tuple(migs),
        use_types=use_types if isinstance(use_types, tuple) else (),
        nouse_types=nouse_types if isinstance(nouse_types, tuple) else (),
        types_text=(use_text, nouse_text),
    )


def gpu_types(annotation: str, text: str) -> tuple[str, ...] | str:
    """The normalized GPU types a HAMi type annotation lists (`A100,H100`), or why it is refused. Empty items name no
    type and are skipped (HAMi would read one as matching every GPU, or, in `nouse-gputype`, none)."""
    if len(text) > MAX_GPU_TYPES * (MAX_GPU_TYPE_CHARS + 1):  # the bound of the work below
        return f"annotation {annotation} is longer than {MAX_GPU_TYPES} GPU types of {MAX_GPU_TYPE_CHARS} characters"
    # Split whole: empty items count for nothing, so a split cut at MAX_GPU_TYPES would leave types in its remainder.
    items = [item for item in (item.strip() for item in text.split(",")) if item]
    if len(items) > MAX_GPU_TYPES:
        return f"annotation {annotation} lists more than {MAX_GPU_TYPES} GPU types; list at most {MAX_GPU_TYPES}"
    if any(len(item) > MAX_GPU_TYPE_CHARS for item in items):
        return (
            f"annotation {annotation} has a GPU type longer than {MAX_GPU_TYPE_CHARS} characters; "
            "give part of a GPU model's name (A100)"
        )
    return tuple(sorted({normalize_model(item) for item in items}))


def eligible_gpus(state: NvidiaNodeState, ask: NvidiaPodState) -> tuple[int, str | None]:
    """(healthy GPUs matching the ask's model and memory, the reason when no GPU of the node matches at all).

    Reasons name the model and memory as the pod wrote them and never the node, so identical situations on
    different nodes aggregate into one line.
    """
    matching = 0
    of_model = 0
    of_type = 0
    for bit in range(len(state.ids)):
        key = state.model_keys[bit]
        if ask.use_types and (key is None or not any(t in key for t in ask.use_types)):
            continue
        if ask.nouse_types and (key is None or any(t in key for t in ask.nouse_types)):
            continue
        of_type |= 1 << bit
        if ask.model_key is not None and key != ask.model_key:
            continue
        of_model |= 1 << bit
        memory = state.memories[bit]
        if ask.memory is not None and (memory is None or memory < ask.memory):
            continue
        matching |= 1 << bit
    if not of_type:
        use, nouse = (safe_text(text, 200) for text in ask.types_text)
        wanted = f'of type "{use}" ({USE_TYPE_ANNOTATION})' if use else "of a type"
        refused = f', none of type "{nouse}" ({NOUSE_TYPE_ANNOTATION})' if nouse else ""
        return 0, f"node(s) have no GPU {wanted}{refused}"
    if not of_model:
        return 0, f'node(s) have no GPU of model "{ask.model}"'
    if not matching:
        model = f' of model "{ask.model}"' if ask.model else ""
        return 0, f"node(s) have no GPU{model} with at least {ask.memory_text} of memory"
    return matching & state.healthy, None


# ----------------------------------------------------------------------------------------------------------
# Shares: placement, refusals, the books
# ----------------------------------------------------------------------------------------------------------


def place(state: NvidiaNodeState, eligible: int, ask: NvidiaPodState) -> NvidiaPlacement | None:
    """Whole containers first (topology sets of untouched GPUs), then each share container on its own GPUs, by the
    state's policy: `bestfit` takes the fullest GPUs that fit, `fgd` those whose use fragments the node least against
    the engine's mix of pods in whole points (`whole_points`), the first by position on a tie (which node fragments
    least is `kubegpu_scheduler_fragmentation`'s, with the node's cpu). The GPUs of a pod of two or more share
    containers are the fullest that fit whatever the policy: where the first share goes decides whether the next
    finds room, and whether a pod fits a node is the node's own answer, kept across the mix's moves (`fit_answer`,
    `PlacementBook`, the engine's memos); by the mix, such a pod was refused, or bound where it no longer fit.

    The score: the whole containers' topology and, under `bestfit`, how full the shared GPUs end up (100: each share
    fills its GPU)."""
    whole = plan_containers(state.tree, eligible & state.free, ask.containers)
    if whole is None:
        return None
    if not ask.shares and state.split == 1:  # a node that does not share: the topology decides, as before sharing
        return NvidiaPlacement(whole, (), plan_score(state.tree, whole))
    taken = sum(mask for _, _, mask, _ in whole)
    fgd = state.policy != "bestfit"
    table = state.fragmentation_table() if fgd and len(ask.shares) == 1 else None
    cores_extra: dict[int, int] = {}
    memory_extra: dict[int, int] = {}
    tasks_extra: dict[int, int] = {}
    chosen_shares: list[tuple[Share, tuple[int, ...], int, tuple[int, ...]]] = []
    free = list(state.free_millis()) if table is not None else []
    by_mix = False  # GPUs of two kinds of room to choose from, ranked by the mix
    for share in ask.shares:
        base = node_fragmentation(free, table) if table is not None and table.weight else 0.0
        # GPUs with as much free that the share would take as much of leave the node alike: measured once.
        measured: dict[tuple[int, int], int] = {}
        fits: list[tuple[float, int, int]] = []
        for bit in range(len(state.ids)):
            if not (eligible >> bit & 1) or taken >> bit & 1 or not state.shareable(bit):
                continue
            memory = share_room(
                state, bit, share, tasks_extra.get(bit, 0), cores_extra.get(bit, 0), memory_extra.get(bit, 0)
            )
            if memory is None:
                continue
            if table is not None:
                amount = share_amount(state, share.cores, memory, bit)
                points = measured.get((free[bit], amount))
                if points is None:
                    grown = fragmentation_after(free, bit, amount, table) - base if table.weight else 0.0
                    points = measured[free[bit], amount] = whole_points(grown)
                rank: float = -points
            else:
                rank = -(state.cores_used[bit] + cores_extra.get(bit, 0) + share.cores) / 100
            fits.append((rank, bit, memory))
        if len(fits) < share.count:
            return None
        by_mix = by_mix or len(measured) > 1
        fits.sort()
        picked_fits = sorted((bit, memory) for _, bit, memory in fits[: share.count])
        picked = tuple(bit for bit, _ in picked_fits)
        for bit, memory in picked_fits:
            cores_extra[bit] = cores_extra.get(bit, 0) + share.cores
            memory_extra[bit] = memory_extra.get(bit, 0) + memory
            tasks_extra[bit] = tasks_extra.get(bit, 0) + 1
            if table is not None:
                free[bit] -= share_amount(state, share.cores, memory, bit)
        chosen_shares.append((share, picked, share.cores, tuple(memory for _, memory in picked_fits)))
    parts = [] if fgd else [100.0 * (state.cores_used[b] + cores_extra[b]) / 100 for b in cores_extra]
    if whole or not parts:
        parts.append(plan_score(state.tree, whole))
    return NvidiaPlacement(whole, tuple(chosen_shares), sum(parts) / len(parts), by_mix)


def fragmentation_grown(
    state: NvidiaNodeState, pod: PodRequest, ask: NvidiaPodState | None, table: FragmentationTable, cpu: int
) -> float | None:
    """`kubegpu_scheduler_fragmentation` computed: the devices the pod strands on the node (`ask` None: it takes
    cpu beside the GPUs, none of them), None where no placement fits."""
    before = state.free_millis()
    if ask is None:
        return fragmentation_delta(before, {}, table, cpu, pod.cpu_milli) / WHOLE
    plan = state.plan(ask)
    if plan is None:
        return None
    taken: dict[int, int] = {}
    for _, _, mask, _ in plan.whole:
        for bit in bit_list(mask):
            taken[bit] = before[bit]
    for share, bits, _, memories in plan.shares:
        for bit, gpu_memory in zip(bits, memories, strict=True):
            taken[bit] = taken.get(bit, 0) + share_amount(state, share.cores, gpu_memory, bit)
    return fragmentation_delta(before, taken, table, cpu, pod.cpu_milli) / WHOLE


def whole_points(grown: float) -> int:
    """KubegpuFragmentation's whole points (100 x sigmoid(-d), d the GPUs stranded) for a node whose fragmentation
    grows by `grown` thousandths of a GPU: the FGD paper's integer score, by which its simulator picks a share's GPU,
    the first on a tie. By the measure itself, kubegpu placed 0.16 points less on the generated trace whose pods are
    seven in ten shares (`benchmarks/sharing_bench.py --traces share-70`, seeds 42-46) and as much on the default
    trace. The simulator's points also count the node's cpu, which `place` does not read (its placements are kept
    per node content), so near a point's edge the two can still choose apart."""
    return int(100.0 / (1.0 + math.exp(min(50.0, grown / WHOLE))))


def fragmentation_after(free: list[int], bit: int, amount: int, table: FragmentationTable) -> float:
    """`node_fragmentation` of the node once `amount` thousandths of GPU `bit` are taken (`free` left as it was)."""
    free[bit] -= amount
    try:
        return node_fragmentation(free, table)
    finally:
        free[bit] += amount


def share_amount(state: NvidiaNodeState, cores: int, memory: int, bit: int) -> int:
    """What a share of `cores` percent and `memory` (the GPU's unit) takes of GPU `bit`, in thousandths, rounded up
    as `free_milli` rounds what is left down."""
    return max(cores * 10, -(-memory * WHOLE // max(1, state.memory_cap[bit])))


def bit_list(mask: int) -> list[int]:
    return [bit for bit in range(mask.bit_length()) if mask >> bit & 1]


def share_never_fits(state: NvidiaNodeState, eligible: int, ask: NvidiaPodState) -> str | None:
    """Why the node could not take the shares even with every GPU free, or None."""
    if ask.shares and not state.offers_shares and eligible:  # (no healthy GPU at all: said below)
        return (
            f"node(s) offer whole GPUs only (one {RESOURCE} per GPU, no {CORES}); "
            f"container {ask.shares[0].container} asks a share"
        )
    for share in ask.shares:
        bits = bit_list(eligible)
        if share.count > len(bits):
            return f"node(s) have fewer than {share.count} GPUs for container {share.container}"
        if share.memory_mib is not None:
            known = [b for b in bits if state.memory_known[b]]
            if not known:
                return f"node(s) do not say how much memory their GPUs have; ask {MEMORY_PERCENT} instead of {MEMORY}"
            largest = max(state.memory_cap[b] for b in known)
            if share.memory_mib > largest:
                hint = ""
                if share.memory_mib >= MIB:  # 1 TiB or more of one GPU: a size in bytes, read as MiB (`1Gi`)
                    hint = (
                        f" ({MEMORY} counts MiB, as in HAMi: a quantity such as 1Gi is read as 1073741824 MiB; "
                        f"write 1024 for 1 GiB)"
                    )
                return (
                    f"node(s) have GPUs of {largest} MiB; the pod asks {share.memory_mib} MiB of {MEMORY} per GPU{hint}"
                )
    if len(ask.shares) > 1 and eligible.bit_count() == 1 and not ask.containers:
        # Each fits the GPU alone; together, they have no other GPU to go to. (Where they have, `place`'s greedy
        # choice on an empty node says nothing of a fuller one: it can fail on the first and fit on the second.)
        return shares_short(state, eligible, ask, empty=True)
    return None


def share_shortage(state: NvidiaNodeState, eligible: int, ask: NvidiaPodState) -> str:
    """What is short for the first share container that finds no room on the node's GPUs as they are."""
    return shares_short(state, eligible, ask) or INSUFFICIENT


def shares_short(state: NvidiaNodeState, eligible: int, ask: NvidiaPodState, *, empty: bool = False) -> str | None:
    """What is short on the GPU that comes closest to the first share container that finds no room, beside the
    pod's own shares placed before it as `place` places them (a pod of several: each on the fullest GPUs that fit)
    and apart from its whole containers' GPUs; None when every share finds room. `empty`: on the node's GPUs with
    nothing on them (whether the pod could ever fit). Two shares of 60 % each fit a GPU apiece, never one together:
    the second is told what the first left it."""
    n = len(state.ids)
    if empty:
        cores, memory, tasks = [0] * n, [0] * n, [0] * n
        open_ = available = eligible
    else:
        cores, memory, tasks = list(state.cores_used), list(state.memory_used), list(state.tasks)
        open_ = eligible & sum(1 << b for b in range(n) if state.holders[b] is None and state.healthy >> b & 1)
        available = eligible & state.free
    whole = plan_containers(state.tree, available, ask.containers)
    if whole is None:
        return INSUFFICIENT
    taken = sum(mask for _, _, mask, _ in whole)
    cap = state.memory_cap
    ours: dict[int, list[str]] = {}  # GPU -> the pod's share containers placed on it so far
    for share in ask.shares:
        who = f"container {share.container}" if len(ask.shares) > 1 else "the pod"
        gpus = [b for b in bit_list(open_) if not taken >> b & 1]
        if not gpus and open_ & taken:
            return f"the pod's own whole-GPU containers leave no GPU for a share; {who} asks a share of {share.count}"
        if not gpus:
            return f"every GPU is held whole by another pod; {who} asks a share of {share.count}"
        room = [b for b in gpus if tasks[b] < state.split]
        if not room:
            return f"every GPU already runs {state.split} shares (the node's split count)"
        if share.memory_mib is not None:  # MiB are counted only of GPUs whose memory is known (`share_room`)
            room = [b for b in room if state.memory_known[b]]
            if not room:
                return f"no GPU with room for a share says how much memory it has; {who} asks {MEMORY} in MiB"

        def beside(b: int) -> str:
            return f" beside container {', '.join(ours[b])} of the pod" if b in ours else ""

        best = max(room, key=lambda b: (100 - cores[b], -b))
        if 100 - cores[best] < share.cores:
            return (
                f"GPU {state.ids[best]} has {100 - cores[best]}% compute free{beside(best)}, {who} asks {share.cores}%"
            )
        fit_cores = [b for b in room if 100 - cores[b] >= share.cores]
        best = max(fit_cores, key=lambda b: (cap[b] - memory[b], -b))
        need = state.memory_of(share, best) or 0
        if cap[best] - memory[best] < need:
            unit = "MiB" if state.memory_known[best] else "%"
            free = cap[best] - memory[best]
            # Without a memory request a share takes each GPU's whole memory (HAMi's rule): say so, or a pod asking
            # 10 % compute reads as asking 16384 MiB it never named.
            named = "" if {MEMORY, MEMORY_PERCENT} & set(share.asked) else f" (all of it: no {MEMORY} asked)"
            return f"GPU {state.ids[best]} has {free} {unit} memory free{beside(best)}, {who} asks {need} {unit}{named}"
        fits = sorted(
            (-(cores[b] + share.cores), b, need)
            for b in fit_cores
            if memory[b] + (need := state.memory_of(share, b) or 0) <= cap[b]
        )
        if len(fits) < share.count:
            return f"{len(fits)} GPU(s) have room for the share, {who} asks {share.count}"
        for _, b, need in fits[: share.count]:
            cores[b] += share.cores
            memory[b] += need
            tasks[b] += 1
            ours.setdefault(b, []).append(share.container)
    return None


def read_allocation(
    state: NvidiaNodeState, allocation: PluginAllocation
) -> tuple[list[int], list[tuple[int, int, int]]] | str:
    """(whole GPU positions, (GPU, cores, memory) per share) that an allocation names, or why it cannot be read on
    this node (a decoded annotation may hold anything)."""
    bits: list[int] = []
    parts: list[tuple[int, int, int]] = []
    for container, resources in allocation.containers.items():
        shares = allocation.shares.get(container)
        for resource in resources:
            if not owns(resource):
                return f"container {container}: resource {resource} is not scheduled by plugin {NAME}"
        if not shares:
            if set(resources) - {RESOURCE}:
                return f"container {container}: {', '.join(sorted(set(resources) - {RESOURCE}))} without shares"
            for device in resources.get(RESOURCE, []):
                bit = state.index.get(device)
                if bit is None:
                    return f"device {device} does not exist on this node"
                if bit in bits:
                    return f"device {device} appears twice in the allocation"
                bits.append(bit)
            continue
        ids = resources.get(RESOURCE, [])
        cores = shares.get(CORES, {})
        memory_resource = MEMORY if MEMORY in shares else MEMORY_PERCENT
        memory = shares.get(memory_resource)
        if memory is None or set(cores) != set(ids) or set(memory) != set(ids) or len(set(ids)) != len(ids):
            return f"container {container}: the shares must name each of its GPUs once with {CORES} and memory"
        for device in ids:
            bit = state.index.get(device)
            if bit is None:
                return f"device {device} does not exist on this node"
            c, m = cores[device], memory[device]
            if not 0 <= c <= 100 or m < 0:
                return f"container {container}: share of GPU {device} out of range ({c}% compute, {m} memory)"
            if memory_resource == MEMORY and not state.memory_known[bit]:
                return f"GPU {device}: memory unknown on this node, the share names {MEMORY}"
            if memory_resource == MEMORY_PERCENT and state.memory_known[bit]:
                m = state.memory_cap[bit] * m // 100
            parts.append((bit, c, m))
    if set(bits) & {bit for bit, _, _ in parts}:
        return "a GPU is named both whole and shared in the allocation"
    return bits, parts


def share_kinds(state: NvidiaNodeState, allocation: PluginAllocation) -> list[tuple[int, int]]:
    """The kind of each share container of an allocation, for the fragmentation policy's mix: its GPUs and the most
    it takes of any of them in thousandths of the tighter of compute and memory (`share_amount`, as `free_milli`
    measures what is left), so a share of 10 % compute with all of a GPU's memory counts as the whole GPU it holds.
    The allocation has been read (`read_allocation`): its GPUs exist here."""
    kinds = []
    for shares in allocation.shares.values():
        cores = shares.get(CORES, {})
        if not cores:
            continue
        percent = MEMORY not in shares
        memory = shares.get(MEMORY_PERCENT if percent else MEMORY, {})
        most = 10
        for device, c in cores.items():
            bit = state.index[device]
            m = memory.get(device, 0)
            if percent and state.memory_known[bit]:
                m = state.memory_cap[bit] * m // 100
            most = max(most, share_amount(state, c, m, bit))
        kinds.append((len(cores), min(WHOLE, most)))
    return kinds


def pod_gpu_models(pod: PodRequest) -> Models:
    """The GPU models a pod may run on, for the fragmentation mix: as its GPU-model annotation, its node selector and
    its required node affinity on `nvidia.com/gpu.product` (`In` values; a term without one allows any) narrow them;
    None where nothing does, or where more than `MAX_KIND_MODELS` are left (the mix keeps its kinds after their pods
    went). Keys as `topology.normalize_model` makes them, as `NvidiaNodeState.gpu_models`."""
    allowed: set[str] | None = None
    narrowing: list[set[str]] = []
    annotated = (pod.annotations.get(MODEL_ANNOTATION) or "").strip()
    if annotated:
        narrowing.append({normalize_model(annotated)})
    selected = pod.node_selector.get(PRODUCT_LABEL)
    if selected is not None:
        narrowing.append({normalize_model(selected)})
    if pod.node_affinity:
        union: set[str] | None = set()
        for term in pod.node_affinity:
            values: set[str] | None = None
            for requirement in term.expressions:
                if requirement.key == PRODUCT_LABEL and requirement.operator == "In":
                    keys = {normalize_model(v) for v in requirement.values}
                    values = keys if values is None else values & keys
            if values is None:
                union = None
                break
            union |= values  # type: ignore[operator]  # not None: checked above
        if union is not None:
            narrowing.append(union)
    for keys in narrowing:
        allowed = keys if allowed is None else allowed & keys
    if allowed is None or len(allowed) > MAX_KIND_MODELS:
        return None  # a kind keeps a bounded set (`MAX_KIND_MODELS`): more models than that, any model
    return frozenset(allowed)


def plan_containers(tree: GroupTree, available: int, containers: tuple[tuple[str, int], ...]) -> Plan | None:
    """Choose GPUs for each container in order from `available`, each from what the previous ones left."""
    plan = []
    for name, n in containers:
        chosen = choose(tree, available, n)
        if chosen is None:
            return None
        mask, size = chosen
        plan.append((name, n, mask, size))
        available &= ~mask
    return tuple(plan)


def plan_score(tree: GroupTree, plan: Plan) -> float:
    """The GPU-weighted mean placement score of a plan's containers."""
    total = sum(n for _, n, _, _ in plan)
    if not total:
        return 100.0
    return sum(n * placement_score(tree, n, size) for _, n, _, size in plan) / total


def instance_type(labels: Mapping[str, str]) -> str | None:
    for label in INSTANCE_TYPE_LABELS:
        value = labels.get(label)
        if value:
            return value.strip()
    return None


@dataclass(frozen=True, slots=True)
class LabelInventory:
    """What GPU Feature Discovery labels (and allocatable) say: GPU count, model, memory per GPU in bytes."""

    count: int
    model: str | None
    memory: int | None
    split: int = 1


def gpus_from_labels(labels: Mapping[str, str], allocatable: Mapping[str, int]) -> LabelInventory | None:
    """Read GFD labels: `nvidia.com/gpu.count` (capped by the GPUs the device plugin offers, `mig.whole_gpus`:
    allocatable `nvidia.com/gpu` over GFD's `nvidia.com/gpu.replicas`, or over the split count where the node lists
    GPU shares, which is also the fallback: the kubelet admits no more), `nvidia.com/gpu.product`,
    `nvidia.com/gpu.memory` (MiB). A malformed number is ignored as if absent. None when the node has no GPUs."""
    count = _label_int(labels.get(COUNT_LABEL))
    offered = allocatable.get(RESOURCE)
    # GPUs the device plugin advertises whole: a sharing device plugin offers each `nvidia.com/gpu.replicas` times (or
    # its split count of times, 100 % of `nvidia.com/gpucores` each), and under MIG's mixed strategy the count label
    # also counts the MIG-enabled GPUs.
    whole = mig.whole_gpus(labels, allocatable)
    if whole is None and _lists_mig(labels, allocatable):
        # MIG devices and no `nvidia.com/gpu` listed: every GPU the count label counts is MIG-enabled (`mig.py` books
        # them, as `books_from_labels` reads them); as whole GPUs too they showed free where no whole-GPU pod runs.
        whole = 0
    if count is None:  # a HAMi node offers 100 compute (or memory) percent per physical GPU
        percent = allocatable.get(CORES) or allocatable.get(MEMORY_PERCENT)
        count = percent // 100 if percent and offered and percent // 100 <= offered else None
    if count is None or (whole is not None and whole < count):
        count = whole
    if not count or count < 1:
        return None
    model = (labels.get(PRODUCT_LABEL) or "").strip() or None
    memory_mib = _label_int(labels.get(MEMORY_LABEL))
    split = offered // count if offered else 1
    return LabelInventory(count, model, memory_mib * MIB if memory_mib is not None else None, split)


def _lists_mig(labels: Mapping[str, str], allocatable: Mapping[str, int]) -> bool:
    """Whether a node has MIG devices, as GFD's mixed strategy lists them: a `nvidia.com/mig-<profile>` in allocatable,
    or its `.count` label, above 0."""
    return any(key.startswith(MIG_PREFIX) and amount > 0 for key, amount in allocatable.items()) or any(
        key.startswith(MIG_PREFIX) and key.endswith(".count") and _label_int(value) for key, value in labels.items()
    )


def offers_shares(split: int, allocatable: Mapping[str, int]) -> bool:
    """Whether a node takes GPU shares: its device plugin offers each GPU more than once (HAMi's, kubegpu's on a node
    enforcing shares: the split count), or it lists a share resource (kubegpu's advertiser on such a node, whatever
    its split). A node offering neither has whole GPUs only, and its CRI shim refuses a share container."""
    return split > 1 or any(allocatable.get(resource) for resource in SHARE_RESOURCES)


def _label_int(value: str | None) -> int | None:
    """A label's count as GFD writes it, ASCII digits (at most 18), else None: Python's `int` would also read
    `1_6384`, `+16384` and other scripts' digits."""
    text = (value or "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


@lru_cache(maxsize=256)
def catalog_tree(kind: str | None, gpus: int) -> GroupTree:
    """The catalog's tree for an instance type when it has exactly `gpus` GPUs, else flat (trees are
    immutable, so nodes of one shape share one)."""
    entry = CATALOG.get(kind) if kind else None
    if entry is None or entry.gpus != gpus:
        return build_tree(FLAT, gpus)
    return build_tree(entry.kind, gpus, entry.groups)


def state_from_labels(
    node: str,
    labels: Mapping[str, str],
    allocatable: Mapping[str, int],
    registered: tuple[hami.RegisteredGPU, ...] | None = None,
) -> NvidiaNodeState | None:
    """The state from GFD's labels and allocatable, or from HAMi's registration (`registered`, as `read_hami` gave
    it) where GFD's `nvidia.com/gpu.count` is absent; with both, the registration gives only each GPU's health."""
    if registered and _label_int(labels.get(COUNT_LABEL)) is None:
        return state_from_registration(node, labels, allocatable, registered)
    found = gpus_from_labels(labels, allocatable)
    if found is None:
        return None
    kind = instance_type(labels)
    entry: InstanceType | None = CATALOG.get(kind) if kind else None
    model = found.model or (entry.model if entry else None)
    memory = found.memory if found.memory is not None else (entry.memory_mib * MIB if entry else None)
    n = found.count
    check_device_count(node, "NVIDIA GPUs", n)
    healthy = [True] * n
    if registered and len(registered) == n:  # GFD says nothing of health; HAMi's device plugin does, per GPU
        healthy = [gpu.healthy for gpu in _in_index_order(registered)]
    return NvidiaNodeState(
        node,
        [str(i) for i in range(n)],
        [model] * n,
        [memory] * n,
        healthy,
        catalog_tree(kind, n),
        split=found.split,
        offers_shares=offers_shares(found.split, allocatable),
    )


HAMI_NOTES_KEY = "hami-notes"  # in the engine's `shared` dict: the last `read_hami` note logged per node
HAMI_NOTES_KEPT = 4096


def read_hami(
    node: str, labels: Mapping[str, str], allocatable: Mapping[str, int], annotations: Mapping[str, str]
) -> tuple[tuple[hami.RegisteredGPU, ...] | None, str | None]:
    """(the GPUs HAMi's device plugin registered on the node, to read; a line for the log, or None): none where the
    node has no registration, where it cannot be read or its handshake is stale (the line says why), and where
    GFD's labels disagree with it (the line says which is believed: GFD's)."""
    text = annotations.get(hami.REGISTER_KEY)
    if text is None:
        return None, None
    read = hami.read_registration(text)
    problem = read if isinstance(read, str) else hami.handshake_problem(annotations, datetime.now(timezone.utc))
    if problem is not None or isinstance(read, str):
        without = "GFD's labels" if _label_int(labels.get(COUNT_LABEL)) is not None else "allocatable alone"
        return None, f"node {node}: HAMi's GPU registration is not read, the GPUs are read from {without}: {problem}"
    count = _label_int(labels.get(COUNT_LABEL))
    if count is None:
        return read, None
    found = gpus_from_labels(labels, allocatable)
    differ = []
    if found is None or found.count != len(read):
        differ.append(f"GFD counts {found.count if found else 0} GPU(s), HAMi registers {len(read)}")
    else:
        models = {normalize_model(gpu.model) for gpu in read if gpu.model}
        if found.model and models and models != {normalize_model(found.model)}:
            listed = ", ".join(sorted({gpu.model for gpu in read if gpu.model}))
            differ.append(f"GFD's model {found.model}, HAMi's {listed}")
        memories = {gpu.memory_mib for gpu in read}
        if found.memory is not None and memories != {found.memory // MIB}:
            listed = ", ".join(str(m) for m in sorted(memories))
            differ.append(f"GFD's memory {found.memory // MIB} MiB, HAMi's {listed} MiB")
    if differ:
        return None, (
            f"node {node}: GPU Feature Discovery's labels are believed over HAMi's GPU registration, which "
            f"disagrees ({'; '.join(differ)})"
        )
    return read, None


def report_hami(node: str, note: str | None, shared: dict[str, object] | None) -> None:
    """Log `read_hami`'s line once per node while it stays the same (HAMi's device plugin rewrites its annotations
    every 30 seconds: each rewrite is a node change), bounded to `HAMI_NOTES_KEPT` nodes remembered."""
    notes = shared.setdefault(HAMI_NOTES_KEY, {}) if shared is not None else {}
    if not isinstance(notes, dict):
        return
    if notes.get(node) == note:
        return
    if len(notes) >= HAMI_NOTES_KEPT:
        notes.clear()
    if note is None:
        notes.pop(node, None)
        return
    notes[node] = note
    log.warning("%s", safe_text(note, 600))


def _in_index_order(gpus: tuple[hami.RegisteredGPU, ...]) -> list[hami.RegisteredGPU]:
    """The GPUs by the index HAMi's device plugin gives each (NVML's), where every entry has a distinct one; else as
    listed (HAMi's older entries give none; NVML's order)."""
    indexes = [gpu.index for gpu in gpus]
    if None in indexes or len(set(indexes)) != len(indexes):
        return list(gpus)
    return sorted(gpus, key=lambda gpu: gpu.index or 0)


def state_from_registration(
    node: str, labels: Mapping[str, str], allocatable: Mapping[str, int], registered: tuple[hami.RegisteredGPU, ...]
) -> NvidiaNodeState | None:
    """The state from HAMi's registration: one GPU per registered physical GPU (ids `0`..: kubegpu's ids, as the
    node side gives them, never one per share slot), each with its model, memory and health; the split count the
    registration's, at most what the kubelet admits (allocatable `nvidia.com/gpu` over the healthy GPUs: it counts
    the healthy GPUs' share slots only). None where the node offers no `nvidia.com/gpu`: the kubelet admits no GPU
    pod there."""
    offered = allocatable.get(RESOURCE, 0)
    if offered <= 0:
        return None
    gpus = _in_index_order(registered)
    n = len(gpus)
    check_device_count(node, "HAMi-registered NVIDIA GPUs", n)
    healthy = sum(gpu.healthy for gpu in gpus)
    split = max([gpu.split for gpu in gpus if gpu.healthy] or [1])
    split = max(1, min(split, offered // max(1, healthy)))
    kind = instance_type(labels)
    return NvidiaNodeState(
        node,
        [str(i) for i in range(n)],
        [gpu.model for gpu in gpus],
        [gpu.memory_mib * MIB if gpu.memory_mib else None for gpu in gpus],
        [gpu.healthy for gpu in gpus],
        catalog_tree(kind, n),
        split=split,
        offers_shares=offers_shares(split, allocatable),
    )


def _id_order(device: DeviceInfo) -> tuple[bool, int, str]:
    """GPU indices in numeric order ("2" before "10"), any other ids after them."""
    numeric = device.id.isdigit()
    return (not numeric, int(device.id) if numeric else 0, device.id)


def state_from_inventory(
    node: str, inventory: DeviceInventory, kind: str | None, allocatable: Mapping[str, int] | None = None
) -> NvidiaNodeState | None:
    """The state from an advertised inventory; its topology wins over the catalog, a malformed one is flat."""
    check_device_count(node, "advertised NVIDIA GPUs", len(inventory.devices))
    if not inventory.devices:
        return None
    devices = sorted(inventory.devices, key=_id_order)
    ids = [d.id for d in devices]
    try:
        tree = tree_from_inventory(inventory.topology, ids)
    except TopologyError as exc:
        log.warning("node %s: nvidia topology ignored, GPUs treated as flat: %s", node, exc)
        tree = build_tree(FLAT, len(ids))
    if tree is None:
        tree = catalog_tree(kind, len(ids))
    allocatable = allocatable or {}
    offered = allocatable.get(RESOURCE, 0)
    # On a node offering shares, the kubelet counts the healthy GPUs' share slots only (kubegpu's advertiser and
    # HAMi's device plugin alike): a GPU gone unhealthy must not lower the split of the others.
    shares = allocatable.get(CORES) or allocatable.get(MEMORY_PERCENT) or allocatable.get(MEMORY)
    gpus = sum(d.healthy for d in devices) if shares else len(ids)
    split = offered // gpus if offered > gpus > 0 else 1
    return NvidiaNodeState(
        node,
        ids,
        [d.model for d in devices],
        [d.memory for d in devices],
        [d.healthy for d in devices],
        tree,
        split=split,
        offers_shares=offers_shares(split, allocatable),
    )


# ----------------------------------------------------------------------------------------------------------
# Factory
# ----------------------------------------------------------------------------------------------------------

# What the entry point names (`kubegpu.plugins.nvidia.scheduler:plugin`), as a pip-installed plugin's.
plugin = NvidiaPlugin()
