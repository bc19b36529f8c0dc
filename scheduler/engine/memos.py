"""What the engine remembers between cycles to sample and rank nodes without asking every node again: per pod
shape, each node's answer (`ShapeAnswers`) and the local scores' raw scores (`LocalRaws`); per node, the number of
its content as the scores read it (`ScoreNumbers`) and as a shape's answers read it (`NodeNumbering`). Each is kept
current from the change log (`NodeCache.changed_since`) and bounded; the engine's state (`state.py`) holds them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kubegpu.core.status import Status
from kubegpu.scheduler.engine.records import NodeRecord


@dataclass(slots=True)
class LocalRaws:
    """The local score plugins' raw scores (`Engine._local_raw`: a tuple per node in `_local_scorers`' order) for
    one pod shape. The memo `Engine._raws`: key `id(Plan.local)`, confirmed by identity, and the epochs of the
    fragmenting plugins the shape may reach (`Scoring.fragmentation_epochs(plan)`; all dropped when one moved: a
    learned mix of pods). `by_number`: by the number of the node's scoring content (`ScoreNumbers`, numbered in
    its `epoch` `numbering`), for nodes alike in what the scores read; `raws`: by node name, for the nodes scored
    alone (no content), up to date with the change log at `generation` (a node the log names since is dropped: its
    usage, devices, labels or liveness changed, or it went); rebuilt when the log no longer reaches back."""

    local: tuple[object, ...]
    epochs: tuple[int | None, ...]
    generation: int
    raws: dict[str, tuple[float, ...]] = field(default_factory=dict)
    by_number: dict[int, tuple[float, ...]] = field(default_factory=dict)
    numbering: int = 0
    # The shape's `by_number` under the epochs before (numbered in `numbering` too): the scores that read no mix
    # (`reads_mix` false) of a content scored then are taken from it, not scored again (`Scoring._local_by_content`).
    before: dict[int, tuple[float, ...]] = field(default_factory=dict)


@dataclass(slots=True)
class ScoreNumbers:
    """Each node's scoring content (`Scoring.scoring_content`) numbered, kept current from the change log: the memo
    `Engine._score_numbers`. `by_name`: node -> the number of its content now (None: scored alone), up to date at
    change number `generation` (-1: never filled); `numbers`: content -> its number, numbered afresh (`epoch`
    moved) past a bound or when the log no longer reaches back. A cycle reads a node's number with one lookup, and a
    content is hashed once per change of the node, not once per shape that ranks it."""

    numbers: dict[tuple[object, ...], int] = field(default_factory=dict)
    by_name: dict[str, int | None] = field(default_factory=dict)
    generation: int = -1
    epoch: int = 0


@dataclass(slots=True)
class ShapeAnswers:
    """Every node's answer to one pod shape as a sampled cycle reads it (`sampling`): the memo `Engine._shape_memo`,
    key (id(Plan.local), the resource the capacity index selects by), confirmed by identity and the amount asked;
    up to date with the change log at `generation` (each node the log names since is asked again: a change of its
    usage, devices, labels or liveness, or its removal), rebuilt when the log no longer reaches back.

    Per node: whether it fits (`check` passes and the index offers `need`), and its answer as a refusal counts it
    (`check`'s, or "Insufficient `resource`" where only the index refuses). Kept with them, for a cycle in which no
    node fits, the sum of those answers' reasons, how many are resolvable, and per node class how many nodes fit,
    how many answer unresolvable, and how many of those not by the filters that read only the node."""

    local: tuple[object, ...]
    resource: str
    need: int
    generation: int
    fits: dict[str, bool] = field(default_factory=dict)
    # The nodes that fit, by their positions in the node tree's list `ordered` (`NodeTree.order()`, by identity;
    # None: not made yet), ascending, and their names in that order: a sample is a slice of them, not a walk.
    positions: list[int] = field(default_factory=list)
    in_order: list[str] = field(default_factory=list)
    ordered: list[str] | None = None
    # A node's content number (`NodeNumbering`) -> the answer below of the nodes with that content, at `numbering`.
    alike: dict[int, tuple[Status, int, bool, bool]] = field(default_factory=dict)
    numbering: int = 0
    # A node class (`NodeRecord.klass`) -> the answer of the filters that read only the node (`_node_fit`): a shape
    # sampled reads no node's name (`Plan.settles`), so it is the class's.
    by_class: dict[int, Status | None] = field(default_factory=dict)
    # node -> (its answer as a refusal, its class, whether it fits, whether the answer is unresolvable by what is in
    # use or the devices, not by the filters that read only the node)
    finals: dict[str, tuple[Status, int, bool, bool]] = field(default_factory=dict)
    reasons: Counter[str] = field(default_factory=Counter)
    resolvable: int = 0
    fitting: Counter[int] = field(default_factory=Counter)
    unresolvable: Counter[int] = field(default_factory=Counter)
    by_usage: int = 0
    # "Insufficient `resource`", the answer of a node whose filters pass where the index refuses it, made once: the
    # answers of a node before and after a change compare by identity where both are it.
    short: Status = field(init=False)

    def __post_init__(self) -> None:
        self.short = Status.unschedulable(f"Insufficient {self.resource}")


@dataclass(slots=True)
class NodeNumbering:
    """Nodes alike in all their answers to a pod read, numbered (`Sampling._content_number`): the memo
    `Engine._numbering`. `numbers`: content -> its number, numbered afresh (`epoch` moved) past a bound; `by_node`:
    node -> (its record, its version, its number), stale when the record or the version differs; `current`: node ->
    its number now, kept current from the change log at `generation` (-1: to be made for every node)."""

    numbers: dict[tuple[object, ...], int] = field(default_factory=dict)
    by_node: dict[str, tuple[NodeRecord, int, int | None]] = field(default_factory=dict)
    epoch: int = 0
    current: dict[str, int | None] = field(default_factory=dict)
    generation: int = -1
