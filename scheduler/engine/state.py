"""The engine's state, all of it set in one place: what each part owns, and every memo with its key and what
invalidates it.

The parts (`ledger`, `cache`, `plan`, `filtering`, `scoring`, `reserving`, `cycle`, `admission`, `preempt`,
`queries`) are layers of one `Engine` (the package's docstring has the layering); each owns the attributes its module
docstring names and reads the others' only through their methods or as documented here. The memos are listed under
"memos" below, and `forget_memos` drops each: a memo not listed there is a bug.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from kubegpu.core.models import (
    LabelSelector,
    NodeSelectorTerm,
    PodRequest,
    SpreadConstraint,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.scheduler_hooks import SETTINGS_KEY, ProfileSettings
from kubegpu.scheduler import scores
from kubegpu.scheduler.dra import DraBook
from kubegpu.scheduler.engine.enqueue import enabled_pre_enqueue, queue_sort
from kubegpu.scheduler.engine.framework import NodeFilter, PermitPlugin, PreEnqueuePlugin, ScorePlugin
from kubegpu.scheduler.engine.kubefilters import CLUSTER_FILTERS, KUBE_FILTERS, NodeResourcesFit, enabled_filters
from kubegpu.scheduler.engine.kubescores import KUBE_SCORES, enabled_scores, may_matter
from kubegpu.scheduler.engine.memos import LocalRaws, NodeNumbering, ScoreNumbers, ShapeAnswers
from kubegpu.scheduler.engine.records import (
    CPU_INDEX,
    FRAGMENTATION_EPOCH_HOOK,
    FRAGMENTATION_HOOK,
    NODE_DIGEST_HOOK,
    POLICIES,
    ClassTally,
    ClusterState,
    NodeRecord,
    NodeRule,
    NodesByValue,
    Passing,
    Plan,
    PodRecord,
    Policy,
    Waiting,
)
from kubegpu.scheduler.engine.rules import guard_embedders, plugin_rules
from kubegpu.scheduler.index import CapacityIndex, NodeTree
from kubegpu.scheduler.owners import Owners
from kubegpu.scheduler.podgroups import MAX_LEVELS, PodGroup
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
        verify_keys: Sequence[bytes] = (),
        scoring: scores.Profile | None = None,
        filters: Sequence[NodeFilter] = (),
        score_plugins: Sequence[ScorePlugin] = (),
        permits: Sequence[PermitPlugin] = (),
        pre_enqueue: Sequence[PreEnqueuePlugin] = (),
        levels: Sequence[str] | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        # -- settings ------------------------------------------------------------------------------------------------
        self.plugins = plugins
        self.policy: Policy = policy
        self.sample = max(1, sample)
        # The profile: which rules are on, by name, and the score plugins' weights (`kubegpu.scheduler.scores`).
        self.scoring = scoring if scoring is not None else scores.Profile.default(policy)
        # PreEnqueue's rules (`enqueue`: SchedulingGates, then the caller's) less those the profile turns off, and the
        # profile's QueueSort plugin, which a front-end's queue orders its pods by (`Engine.pre_enqueue`,
        # `queue_sort`).
        # An embedder's rules are guarded as a plugin's are (`rules.guard_embedders`): one that fails costs its pod.
        filters, score_plugins, pre_enqueue = guard_embedders(plugins, filters, score_plugins, pre_enqueue)
        self._pre_enqueue = enabled_pre_enqueue(pre_enqueue, self.scoring.pre_enqueue_off)
        self._queue_sort = queue_sort(self.scoring.queue_sort)
        # The Filter extension point's rules by name (`kubefilters`), then the caller's `filters`, less those the
        # profile turns off: the ones that read only the node, the ones that read what is in use, the cluster-wide
        # ones; and whether NodeResourcesFit is among them (else the capacity index refuses no node).
        # The rules plugins add (`kubegpu_scheduler_rules`, guarded: `rules`) come after the caller's.
        taken = {rule.name for rule in (*KUBE_FILTERS, *filters)} | {rule.name for rule in CLUSTER_FILTERS}
        taken |= {plugin.name for plugin in (*KUBE_SCORES, *score_plugins)}
        added_filters, added_scores = plugin_rules(plugins, taken)
        node_filters, self._cluster_filters = enabled_filters((*filters, *added_filters), self.scoring.filters_off)
        self._node_filters = tuple(rule for rule in node_filters if not rule.reads_usage)
        self._usage_filters = tuple(rule for rule in node_filters if rule.reads_usage)
        # DynamicResources on: its PreFilter (`_validate`) and Reserve (`_allocate_and_hold`) run with its Filter.
        self._dra_on = any(rule.name == "DynamicResources" for rule in node_filters)
        self._added_filters = frozenset(
            rule.filter for rule in node_filters if rule not in KUBE_FILTERS
        )  # a third party's
        self._fit_by_index = any(isinstance(rule, NodeResourcesFit) for rule in node_filters)
        # The score plugins (`kubescores`, then the caller's `scores`) with their weights, the local ones first: a
        # shape remembers their raw scores in that order (`memos.LocalRaws`).
        self._scorers = enabled_scores((*score_plugins, *added_scores), self.scoring, policy)
        self._local_scorers = tuple(plugin for plugin, _ in self._scorers if plugin.local)
        # Those whose `matters` may answer True (`kubescores.may_matter`): asked in every cycle (`_sample_size`).
        self._sample_deciders = tuple(plugin for plugin, _ in self._scorers if may_matter(plugin))
        self._scores_fragmentation = any(plugin.name == scores.FRAGMENTATION for plugin, _ in self._scorers)
        self._added_scores = any(plugin not in KUBE_SCORES for plugin, _ in self._scorers)
        self.signing_key = signing_key
        # Keys whose signatures bound pods' allocations may also carry (`--allocation-verify-key-file`: the key being
        # rotated in or out), never used to sign; and the pods holding devices by such an allocation, until they go.
        self.verify_keys = tuple(key for key in verify_keys if key != signing_key) if signing_key is not None else ()
        self.on_verify_keys: set[str] = set()
        # Per plugin, the dict its states share across this engine's nodes (`kubegpu_scheduler_build_node`'s `shared`),
        # holding the profile's settings for device plugins.
        settings = ProfileSettings(
            self.scoring.share_policy, self.scoring.fragmentation_mix, self.scoring.fragmentation_model_access
        )
        self._shared: dict[str, dict[str, object]] = {name: {SETTINGS_KEY: settings} for name in plugins.names}
        self._fit_calls: dict[str, Callable[..., Any]] = {}  # each plugin's fit hook (`KubegpuPluginManager.bound`)
        # The plugins that measure fragmentation (`kubegpu_scheduler_fragmentation`), and how many nodes hold a state
        # of one of them (under ""), and of those how many hold a state of each plugin: KubegpuFragmentation may rank
        # a pod's nodes otherwise than the policy's order only where the pod may go to such a node.
        self._fragmenters = tuple(p for p in plugins.names if plugins.implements(p, FRAGMENTATION_HOOK))
        self._fragmenting_nodes: Counter[str] = Counter()
        # Of those, the ones with `kubegpu_scheduler_fragmentation_epoch` (the others' answers follow from the node);
        # and per plugin, how many nodes hold its state beside each fragmenting plugin's: a device pod is ranked only
        # on nodes holding its plugins' states, so a cycle asks the epochs of just the fragmenting plugins beside its
        # first one (`Scoring.fragmentation_epochs`), not those of a family it cannot reach.
        self._epoch_askers = frozenset(p for p in self._fragmenters if plugins.implements(p, FRAGMENTATION_EPOCH_HOOK))
        self._fragmenting_beside: dict[str, Counter[str]] = {}
        # The plugins whose states read more of a node than its labels, allocatable and inventories
        # (`kubegpu_scheduler_node_digest`): what they answer is part of the node's class (`NodeCache.node_digest`).
        self._digesters = tuple(p for p in plugins.names if plugins.implements(p, NODE_DIGEST_HOOK))
        # (plugin, node) whose digest failed and was logged: logged again only after it answered (each Node update
        # and each recheck asks it again; a plugin failing on every node logged thousands of lines a minute).
        self._digest_failing: set[tuple[str, str]] = set()
        # Of those, the nodes whose devices a plugin shares (`kubegpu.core.kit.shares_devices`), counted the same way:
        # a pod that may reach one has its nodes ranked by kube-scheduler's count even when the profile leaves
        # `percentageOfNodesToScore` unset (`fragmentation_matters`).
        self._sharing_nodes: Counter[str] = Counter()
        self._issued = 0  # ledger: the `issued` stamp of the last signed allocation; stamps strictly increase

        # -- the cluster state (cache, ledger) -----------------------------------------------------------------------
        self.nodes: dict[str, NodeRecord] = {}
        self.pods: dict[str, PodRecord] = {}
        # The placed pods by namespace and labels, and their inter-pod terms by distinct term (replicas share theirs):
        # a cycle's affinity and spread counts visit only the pods a term can select (`kubegpu.scheduler.podindex`).
        self._placed = PodIndex()
        self._priorities: Counter[int] = Counter()  # priorities of the placed pods, for preemption's quick no
        self._index: dict[str, CapacityIndex] = {CPU_INDEX: CapacityIndex()}  # free amount per resource, per node
        # Node class key (`NodeCache._klass`) -> class number, and back, for the classes some node is in: a class
        # whose last node left or changed goes (labels such as GFD's timestamp make a new class at each relabelling).
        # Numbers are never reused, so a memo keyed by one (`_tallies`, `_skipped`) cannot answer for another class.
        self._classes: dict[tuple[object, ...], int] = {}
        self._class_keys: dict[int, tuple[object, ...]] = {}
        self._class_serial = 0
        self._class_nodes: dict[int, dict[str, None]] = {}  # node class -> its nodes
        # The nodes zone by zone in turn, and where the next sample taken from them starts (kube-scheduler's node tree
        # and `nextStartNodeIndex`): a pod whose scores read more than its node is scored on such a sample.
        self._tree = NodeTree()
        self._next_start = 0
        self._soft_tainted: set[str] = set()  # nodes with a PreferNoSchedule taint
        # What ImageLocality and NodePreferAvoidPods read beyond one node (`_note_scored`): how many nodes list each
        # image name, and how many list it at each size (each node scores its own size, so an image every node lists
        # still tells them apart when the sizes differ: `_images_matter`); the controllers each node's
        # preferAvoidPods names, and on how many nodes each is named.
        self._image_nodes: Counter[str] = Counter()
        self._image_sizes: dict[str, Counter[int]] = {}
        self._avoid: dict[str, frozenset[tuple[str, str]]] = {}
        self._avoided: Counter[tuple[str, str]] = Counter()
        # What the node side reports (`set_node_live`, `set_held_devices`): the nodes whose kubegpu node lease expired,
        # with the reason device pods are refused there; per node, the ids its kubelet gave pods kubegpu did not place.
        self._dead: dict[str, str] = {}
        self._published: dict[str, dict[str, dict[str, dict[str, list[str]]]]] = {}
        self.nominated: dict[str, str] = {}  # preempting pod -> the node its victims are leaving
        # The preempting pods' requests, by key (`nominate`): a node held for one refuses only the pods that would
        # leave it no room there (`Filtering._nominee_refusal`), so the filter needs what it asks.
        self.nominee_requests: dict[str, PodRequest] = {}
        # Placed pods being deleted (a deletionTimestamp: a preemption's victims, or any pod terminating), by key
        # (`mark_leaving`): a nominee's place is judged as it will be once they are gone.
        self.leaving: set[str] = set()
        self._preempt_start = 0  # where the next preemption starts trying nodes (`Preempting.preempt`)
        # A preempting gang (`namespace/name`) -> the nodes of the domain its victims are leaving (`nominate_gang`);
        # on each of them, `nominees` holds it as `gang_nominee(key)`.
        self.nominated_gangs: dict[str, tuple[str, ...]] = {}

        # -- gangs and the Permit stage (permit, gangs) ------------------------------------------------------------
        # The Permit rules after the built-in Coscheduling one; the pods waiting at Permit, by key, with their
        # reservations held (an entry whose pod no longer holds that reservation is dropped when next read).
        self._permits = tuple(permits)
        self.waiting: dict[str, Waiting] = {}
        # The same keys by their gang (`gang_key`, None for a pod of no gang): Coscheduling asks "is another gang
        # partly held?" per member without a pass over every waiting pod (`Permitting._wait`, `_unwait`).
        self._waiting_gangs: dict[str | None, dict[str, None]] = {}
        # The PodGroups a front-end reports (`set_pod_group`), by `namespace/name`; a Kueue group needs none.
        self.pod_groups: dict[str, PodGroup] = {}
        # The topology levels, widest first, without the hostname (None: the known labels, `podgroups.KNOWN_LEVELS`).
        if levels is not None and len(tuple(levels)) > MAX_LEVELS:
            raise ValueError(f"at most {MAX_LEVELS} topology levels")
        self.levels: tuple[str, ...] | None = None if levels is None else tuple(levels)

        # -- what a plan reads beyond the pod (plan) -----------------------------------------------------------------
        # The Services, ReplicationControllers, ReplicaSets and StatefulSets a front-end reports (`set_owner`): a
        # pod with no spread constraints of its own gets the profile's default ones, selecting what they select.
        self._owners = Owners()
        # Volumes, when a front-end supplies them (`track_volumes`): claim (namespace, name) -> bound volume name
        # ("" while unbound), volume name -> its required node affinity terms (None: any node).
        self.track_volumes = False
        self.claims: dict[tuple[str, str], str] = {}
        self.deleting_claims: set[tuple[str, str]] = set()  # claims with a deletionTimestamp
        self.volumes: dict[str, tuple[NodeSelectorTerm, ...] | None] = {}
        # DRA (`kubegpu.scheduler.dra`): DeviceClasses, ResourceSlices, ResourceClaims and their templates, and the
        # devices allocated; a pod's claims are held with it (`PodRecord.claims`).
        self.dra = DraBook()

        # -- epochs: counters that only grow, bumped by the changes the memos below depend on ----------------------
        # Every change of a node's state is numbered; `changed_since` names the nodes changed after a number, so a
        # caller can keep answers per node and redo only the nodes that changed (the extender does).
        self.generation = 0
        self._changes: list[str] = []  # the most recent changes: _changes[i] is change number _first + i + 1
        self._first = 0
        self._node_epoch = 0  # a node added, changed or removed (not its usage)
        self._anti_epoch = 0  # a placed pod with required anti-affinity terms came or went
        self._namespace_epoch = 0  # a Namespace's labels changed (`set_namespace`)
        self._volume_epoch = 0  # a claim or volume changed
        # (`Owners.epoch`: an owner that selects pods changed.)

        # -- memos: each one's key, and what invalidates it. `forget_memos` drops them all; the engine must answer
        # alike with and without them (tests/scheduler/test_engine_memos.py holds each against a fresh engine). -----
        # pod's requested extended resources -> {owning plugin ("" for none): resources}. Never stale: ownership is
        # fixed when the plugin manager is built. Past 4096, dropped all at once (tenants name extended resources).
        self._routes: dict[frozenset[str], dict[str, list[str]]] = {}
        # The last pod routed, held (compared by identity, so its id cannot pass for another's), with its routes: a
        # cycle routes the same pod in PreFilter, its plan and on every node its device scores read. Never stale: a
        # PodRequest is frozen and ownership fixed.
        self._routed: tuple[PodRequest | None, dict[str, list[str]]] = (None, {})
        # id(pod) -> (pod, its Plan), the pod held so the id stays its own. Stale when `Plan.stamp` differs from
        # `_stamp` (the generation for a volatile plan, else the anti-affinity epoch; plus the volume epoch for a
        # pod naming claims) or `Plan.owners` from the owners' epoch. Past 256 pods, dropped all at once.
        self._plans: dict[int, tuple[PodRequest, Plan]] = {}
        # id(pod.containers) -> (a pod, its Plan): a pod equal to the one held in every field but its name and uid
        # (`plan.ALIKE`, by value) takes that plan, as `_plans` gives a pod its own: a trace's renamed copies and a
        # workload's replicas share their containers. Stale as `_plans`; not for a pod with resource claims, nor with
        # a third party's filters (`Planning._plans_alike_for`). Past 256, dropped all at once.
        self._plans_alike: dict[int, tuple[PodRequest, Plan]] = {}
        # id(pod signature, its non-volatile part, interned in `_signatures`) -> (that signature, held so the id stays
        # its own, each owning plugin's `kubegpu_scheduler_prepare` answer). Never stale: the signature holds all a
        # plugin may read of the pod. Past 4096, dropped all at once.
        self._prepared: dict[int, tuple[tuple[object, ...], dict[str, object]]] = {}
        # id(Plan.local) -> (Plan.local, the node filters that apply to such pods: `Plan.node_rules`, `usage_rules`),
        # when no third party added a filter (kube-scheduler's decide from fields `local` holds). Never stale: the
        # filters are fixed when the engine is built. Past 4096, dropped all at once.
        self._rules: dict[int, tuple[tuple[object, ...], tuple[NodeRule, ...], tuple[NodeRule, ...]]] = {}
        # signature -> itself: interning, so comparing signatures is mostly an identity check. Past 4096, cleared.
        self._signatures: dict[tuple[object, ...], tuple[object, ...]] = {}
        # owners' combined selector -> the profile's default spread constraints with it. Cleared by `set_owner`.
        self._defaulted: dict[LabelSelector, tuple[SpreadConstraint, ...]] = {}
        # (topology keys, node inclusion policy, and what the policy reads of the pod: node selector and node affinity
        # when it honours affinity, tolerations when it honours taints) -> (node epoch, the nodes whose pods count
        # for a spread constraint of that policy). Stale when the node epoch moved. Past 256, dropped all at once.
        self._domains: dict[tuple[object, ...], tuple[int, Domains]] = {}
        # label key -> (node epoch, the nodes by their value of it and those without it: `records.NodesByValue`).
        # Stale when the node epoch moved (a node added, changed or removed). Past 64 keys, dropped all at once.
        self._by_value: dict[str, tuple[int, NodesByValue]] = {}
        # The last pod's cluster-wide filter state (InterPodAffinity, PodTopologySpread PreFilter): keyed by the pod
        # and its plan (identity) and the generation; stale when any of them differs.
        self._cluster: ClusterState | None = None
        # (node class, id(Plan.local)) -> every node's answer in a class settled by an unresolvable answer its nodes
        # may give apart (`_tally`). Kept current from the change log (`changed_since`; nodes holding a nominee are
        # asked again each time); rebuilt when the log no longer reaches back. Past 256, dropped all at once.
        self._tallies: dict[tuple[int, int], ClassTally] = {}
        # (node class, id(Plan.local), the capacity index's resource) -> every node's answer in the class, for a cycle
        # that explains the nodes its index passed over (`_skipped_tally`; a node that would fit is counted short of
        # that resource). Kept current from the change log like `_tallies`, nodes holding a nominee asked again each
        # time; none for a pod with inter-pod rules or claims. Past 256, dropped all at once.
        self._skipped: dict[tuple[int, int, str], ClassTally] = {}
        # gang (`namespace/name`) -> (the placed pods' index version, `gang_holders`' answer): Permit asks it for
        # every member of a gang, and a gang of thousands is placed at once. Stale when the index version moved
        # (any pod placed or released). Past 4096 gangs, dropped all at once.
        self._gang_holders: dict[str, tuple[int, tuple[str, ...]]] = {}
        # Each node's scoring content numbered, kept current from the change log (`memos.ScoreNumbers`): nodes
        # alike in all the local score plugins read (`Scoring.scoring_content`: the node's class, its usage, each
        # device plugin state's `scoring_content()`) share one computation of a shape's raw scores
        # (`LocalRaws.by_number`), so a cycle that scores every node computes once per distinct node (in the FGD
        # experiment on the openb trace, a few hundred of its 1,213). None for a pod with preferred node affinity
        # (its score reads the node's name) or when a third party added a score plugin (it may read anything).
        self._score_numbers = ScoreNumbers()
        # node name -> (its record, its version, its scoring content or None), for `_score_numbers`; stale when the
        # record or its version differs. Past `CONTENTS_REMEMBERED`, dropped all at once.
        self._contents: dict[str, tuple[NodeRecord, int, tuple[object, ...] | None]] = {}
        # id(Plan.local) -> the nodes passing that shape's node-local filters and device fit (`filtering.Passing`):
        # kept current from the change log, rebuilt when it no longer reaches back. Past 256, dropped all at once.
        self._passing: dict[int, Passing] = {}
        # id(Plan.local) -> the local score plugins' raw scores of that shape by content number and by node
        # (`memos.LocalRaws`), with the fragmentation epochs they were scored at: dropped when an epoch moved; by
        # node kept current from the change log, dropped when it no longer reaches back. Past 256, dropped at once.
        self._raws: dict[int, LocalRaws] = {}
        # (id(Plan.local), the resource its capacity index selects by) -> every node's answer to that shape as a
        # sampled cycle reads it (`sampling`, `memos.ShapeAnswers`): kept current from the change log, rebuilt when
        # it no longer reaches back. Past 256, dropped all at once.
        self._shape_memo: dict[tuple[int, str], ShapeAnswers] = {}
        # Each node's content numbered (`memos.NodeNumbering`): a shape's answer is remembered per number too, so a
        # node changed into a content another node had answers from memory. Numbered afresh past 65536 contents.
        self._numbering = NodeNumbering()
        # The node tree's order (`NodeTree.order()`, by identity) and each node's position in it, for the masks of
        # `ShapeAnswers`.
        self._positions: tuple[list[str] | None, dict[str, int]] = (None, {})
        # (`Plan.local` is what kube-scheduler's node filters and the node-local scores read of a pod without devices,
        # else, or when a rule a third party added applies to it, the pod's whole signature.)
        # Per node (`NodeRecord`): `last_check`, id(Plan.local) -> (node version, Plan.local, answer), the node-local
        # filter answers, stale when the node's version moved (every change of its usage, devices or liveness) or the
        # shape is another's; `CHECKS_REMEMBERED` shapes per node, oldest out.
        # `last_score`: (node version, Plan.signature, the fragmentation epochs, the extender's device score), one slot:
        # a device score may read the plugin's learned mix (neuron's discount for the sizes a placement turns away).
        # `dra._answers` (`DraBook`): (CEL expression, device facts) -> the selector's answer, and `dra._both`:
        # (class selectors, request selectors, device facts) -> both accept. Never stale: the facts are all a
        # selector reads of a device. Past 65536, cleared. A pod's DRA answers are in `last_check` under its
        # plan's `local`, which holds its claims' specs and the DRA epochs (`DraBook.demand_key`).
        # `last_victims`: (node version, Plan.local, the pod's priority, the budgets, the victims a preemption's dry
        # run chose there), one slot, for pods tried on a copy (`Preempting._select_victims`); stale when the node's
        # version moved (its pods, or a nomination) or any of the rest differs. Consecutive preemptions try mostly
        # unchanged nodes, so each asks again only the nodes that changed.

    def forget_memos(self) -> None:
        """Drop every memo listed above: the engine then answers from its state alone (the tests' oracle)."""
        self._routes.clear()
        self._routed = (None, {})
        self._plans.clear()
        self._plans_alike.clear()
        self._prepared.clear()
        self._signatures.clear()
        self._rules.clear()
        self._defaulted.clear()
        self._domains.clear()
        self._by_value.clear()
        self._cluster = None
        self._tallies.clear()
        self._skipped.clear()
        self._gang_holders.clear()
        self._score_numbers = ScoreNumbers()
        self._contents.clear()
        self._passing.clear()
        self._raws.clear()
        self._shape_memo.clear()
        self._numbering = NodeNumbering()
        self._positions = (None, {})
        self._owners.forget_memos()
        self.dra.forget_memos()
        for record in self.nodes.values():
            record.last_check, record.last_score, record.last_victims = {}, None, None
