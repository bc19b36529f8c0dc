"""The engine's state, all of it set in one place: what each part owns, and every memo with its key and what
invalidates it.

The parts (`cache`, `ledger`, `plan`, `filtering`, `scoring`, `cycle`, `admission`, `preempt`, `queries`) are layers
of one `Engine`; each owns the attributes its module docstring names and reads the others' only through their
methods or as documented here. Memos are listed under "memos" below: a memo not listed here is a bug.
"""

from __future__ import annotations

from collections import Counter

from kubegpu.core.models import (
    LabelSelector,
    NodeSelectorTerm,
    PodRequest,
    SpreadConstraint,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine.records import (
    CPU_INDEX,
    POLICIES,
    ClassTally,
    ClusterState,
    NodeRecord,
    Plan,
    PodRecord,
    Policy,
)
from kubegpu.scheduler.index import CapacityIndex, NodeTree
from kubegpu.scheduler.owners import Owners
from kubegpu.scheduler.podindex import Domains, PodIndex


class EngineState:
    """The attributes every part of the engine reads, and the memos, each with its key and what invalidates it."""

    def __init__(
        self,
        plugins: KubegpuPluginManager,
        *,
        policy: Policy = "binpack",
        sample: int = 8,
        signing_key: bytes | None = None,
        scoring: scores.Profile | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.plugins = plugins
        self.policy: Policy = policy
        self.sample = max(1, sample)
        # The score plugins and their weights, the filters turned off (`kubegpu.scheduler.scores`).
        self.scoring = scoring if scoring is not None else scores.Profile.default(policy)
        self.filters_off = self.scoring.filters_off
        # The placed pods by namespace and labels, and their inter-pod terms by distinct term (replicas share theirs):
        # a cycle's affinity and spread counts visit only the pods a term can select (`kubegpu.scheduler.podindex`).
        self._placed = PodIndex()
        # The nodes whose pods count for a spread constraint, per (topology keys, node selector, node affinity), as of
        # `_node_epoch` (bumped whenever a node is added, changed or removed).
        self._domains: dict[tuple[object, ...], tuple[int, Domains]] = {}
        self._node_epoch = 0
        self._soft_tainted: set[str] = set()  # nodes with a PreferNoSchedule taint
        # What ImageLocality and NodePreferAvoidPods read beyond one node (`_note_scored`): how many nodes list each
        # image name, and how many list it at each size (each node scores its own size, so an image every node lists
        # still tells them apart when the sizes differ: `_images_matter`); the controllers each node's
        # preferAvoidPods names, and on how many nodes each is named.
        self._image_nodes: Counter[str] = Counter()
        self._image_sizes: dict[str, Counter[int]] = {}
        self._avoid: dict[str, frozenset[tuple[str, str]]] = {}
        self._avoided: Counter[tuple[str, str]] = Counter()
        self.signing_key = signing_key
        self.nodes: dict[str, NodeRecord] = {}
        self.pods: dict[str, PodRecord] = {}
        self._index: dict[str, CapacityIndex] = {CPU_INDEX: CapacityIndex()}
        self._routes: dict[frozenset[str], dict[str, list[str]]] = {}
        self._classes: dict[tuple[object, ...], int] = {}
        self._class_nodes: dict[int, dict[str, None]] = {}  # node class -> its nodes
        # The nodes zone by zone in turn, and where the next sample taken from them starts (kube-scheduler's node tree
        # and `nextStartNodeIndex`): a pod whose scores read more than its node is scored on such a sample.
        self._tree = NodeTree()
        self._next_start = 0
        # (node class, id(Plan.local)) -> every node's answer in a class settled by an unresolvable answer its nodes
        # may give apart (`_tally`); kept current from the change log, dropped all at once past 256.
        self._tallies: dict[tuple[int, int], ClassTally] = {}
        # Every change of a node's state is numbered; `changed_since` names the nodes changed after a number, so a
        # caller can keep answers per node and redo only the nodes that changed (the extender does).
        self.generation = 0
        self._changes: list[str] = []  # the most recent changes: _changes[i] is change number _first + i + 1
        self._first = 0
        self._signatures: dict[tuple[object, ...], tuple[object, ...]] = {}
        self._plans: dict[int, tuple[PodRequest, Plan]] = {}  # by id(pod), holding the pod so the id stays its own
        self._prepared: dict[tuple[object, ...], dict[str, object]] = {}  # by pod signature (without volatile parts)
        self._issued = 0  # the `issued` stamp of the last signed allocation: stamps strictly increase
        # Bumped whenever a placed pod with required anti-affinity terms (which can refuse an incoming pod on nodes
        # other than its own) comes or goes: plans made before are made again.
        self._anti_epoch = 0
        self._cluster: ClusterState | None = None
        # The Services, ReplicationControllers, ReplicaSets and StatefulSets a front-end reports (`set_owner`): a
        # pod with no spread constraints of its own gets the profile's default ones, selecting what they select.
        self._owners = Owners()
        self._defaulted: dict[LabelSelector, tuple[SpreadConstraint, ...]] = {}
        # Volumes, when a front-end supplies them (`track_volumes`): claim (namespace, name) -> bound volume name
        # ("" while unbound), volume name -> its required node affinity terms (None: any node).
        self.track_volumes = False
        self.claims: dict[tuple[str, str], str] = {}
        self.deleting_claims: set[tuple[str, str]] = set()  # claims with a deletionTimestamp
        self.volumes: dict[str, tuple[NodeSelectorTerm, ...] | None] = {}
        self._volume_epoch = 0
        self._priorities: Counter[int] = Counter()  # priorities of the placed pods, for preemption's quick no
        self.nominated: dict[str, str] = {}  # preempting pod -> the node its victims are leaving
        # What the node side reports (`set_node_live`, `set_held_devices`): the nodes whose kubegpu node lease expired,
        # with the reason device pods are refused there; per node, the ids its kubelet gave pods kubegpu did not place.
        self._dead: dict[str, str] = {}
        self._published: dict[str, dict[str, dict[str, dict[str, list[str]]]]] = {}
