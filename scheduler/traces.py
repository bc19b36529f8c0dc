"""GPU cluster traces in Alibaba's `cluster-trace-gpu-v2023` ("openb") format, replayed through the engine.

A trace is two CSV files: a node list (`sn, cpu_milli, memory_mib, gpu, model`) and a pod list (`name, cpu_milli,
memory_mib, num_gpu, gpu_milli, gpu_spec, ..., creation_time, deletion_time`), the format of the FGD paper's
simulator (USENIX ATC'23). A pod asks `num_gpu` GPUs of `gpu_milli` thousandths each: a share of one GPU when
`num_gpu` is 1 and `gpu_milli` below 1000, whole GPUs otherwise, nothing when `num_gpu` is 0 (whatever
`gpu_milli`, a number 0..1000 all the same, says); `gpu_spec` (`A|B`) restricts the GPU model. Other columns are
ignored.

Each row becomes the manifests kubegpu schedules, as a HAMi-compatible cluster has them (`node_document`,
`pod_document`): a node advertises `nvidia.com/gpu` = GPUs x `SPLIT`, `nvidia.com/gpucores` and
`nvidia.com/gpumem-percentage` 100 per GPU, GFD's `nvidia.com/gpu.count` and `nvidia.com/gpu.product` (the model);
a share asks `nvidia.com/gpu: 1` with `gpucores` and `gpumem-percentage` of its fraction in whole percent, rounded
up (505 thousandths ask 51 %, never less than the trace says); a model constraint is a required node affinity on
`nvidia.com/gpu.product`; cpu and memory are asked as the trace says.

Two replays (`replay`):

* **timeline**: every pod is created at its `creation_time` and deleted at its `deletion_time` (a deletion at the
  same second as a creation goes first, freeing what it held; a pod whose deletion is not after its creation
  leaves at once);
* **experiment** (the paper's): every pod arrives once in a random order (`seed`), never leaves, and copies of
  randomly drawn pods are appended until the pods have asked for `inflate` x the cluster's GPU capacity (a copy of
  `p` is `p-copyN`, N the next number no pod of the trace is named with).

Either way each pod is scheduled at once or fails for good, and the *allocation curve* is the paper's accounting:
after each pod, the arrived share is the GPU-milli asked by every pod so far (failed ones included) over the
capacity (GPUs x 1000), and the allocated share the GPU-milli held by pods now placed over the capacity; the curve
is the mean allocated share of the pods whose arrived share rounds to each whole percent, and the headline is its
value at 100 %.

A trace is someone else's file: reading one is bounded (`MAX_TRACE_BYTES`, `MAX_LINES`, `MAX_LINE_CHARS`,
`MAX_ROWS`, `MAX_FIELD_CHARS`, integers below `MAX_VALUE`, memory below `MAX_MEMORY_MIB`, at most `MAX_NODES` nodes
with `MAX_GPUS` GPUs in all) and a bad row stops the run before anything is scheduled, with a `TraceError` naming the
file, the line and the column.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kubegpu.core.errors import InputError, shorten
from kubegpu.core.manifests import node_info, pod_request, pod_uid
from kubegpu.core.models import PodRequest
from kubegpu.scheduler.engine import Engine

__all__ = [
    "AllocationCurve",
    "ReplayResult",
    "TraceError",
    "TraceNode",
    "TracePod",
    "experiment_order",
    "node_document",
    "pod_document",
    "read_nodes",
    "read_pods",
    "replay",
]

MAX_TRACE_BYTES = 64 * 1024 * 1024
MAX_ROWS = 1_000_000
MAX_FIELD_CHARS = 253  # a Kubernetes object name's limit; no field of the format needs more
# A line, and the lines of a file: openb's rows are under 120 characters. Without them a header of a million short
# columns (3 bytes each in the file, about 100 as Python's strings and lists) made 64 MiB into 2 GB (T148).
MAX_LINE_CHARS = 65_536
MAX_LINES = 2_000_000
MAX_VALUE = 10**15  # any count, millicore, MiB or second of a real trace is far below
# The most MiB a row may give as memory: a manifest's quantity is at most 2**63 - 1 bytes, as Kubernetes' own.
MAX_MEMORY_MIB = (2**63 - 1) >> 20
# Nodes and GPUs a node list may build: each node row costs the engine about 1.7 KB, and 270 KB with 1024 GPUs, so
# the file and row bounds alone let 15 MB ask for hundreds of GB. Ten times the nodes Kubernetes supports in a
# cluster, sixteen times the GPUs of openb's whole trace.
MAX_NODES = 50_000
MAX_GPUS = 100_000
MAX_INFLATE = 10.0
MAX_ARRIVALS = 5_000_000  # pods an experiment may replay, copies included
SPLIT = 10  # shares per GPU a node offers (HAMi's default `deviceSplitCount`)
NAMESPACE = "trace"
GPU = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
_LABEL_VALUE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")  # what a trace's GPU model must become
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "creation_time", "deletion_time")
Mode = Literal["timeline", "experiment"]


class TraceError(InputError):
    """A trace file that cannot be replayed; the message names the file, the line and the column."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    milli: int  # thousandths of each GPU (0 for a pod without GPUs)
    models: tuple[str, ...]
    created: int = 0
    deleted: int | None = None  # None: never deleted

    @property
    def gpu_milli(self) -> int:
        return self.gpus * self.milli


# ------------------------------------------------------------------------------------------------------------
# Reading the CSV files
# ------------------------------------------------------------------------------------------------------------


def _rows(
    path: Path, columns: tuple[str, ...], optional: frozenset[str] = frozenset()
) -> Iterator[tuple[str, dict[str, str]]]:
    """(`file:line`, row) for each data row; the header must name every column of `columns` not in `optional`."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_TRACE_BYTES + 1)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"{path}: larger than {MAX_TRACE_BYTES >> 20} MiB")
    zero = data.find(b"\0")
    if zero >= 0:
        raise TraceError(f"{path}: binary data (a NUL byte at offset {zero}), not a CSV text file")
    try:
        data.decode("utf-8")  # checked whole, to name the offset; read line by line below
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    # Decoded a line at a time from the bytes read (`BytesIO` shares them): the text whole, then as a `StringIO`
    # (four bytes a character), cost six times the file before the first row.
    stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig", newline="")
    lines = _Lines(stream, path)
    reader = csv.reader(lines, strict=True)
    try:
        header = next(reader, None)
        lines.row()
        if header is None:
            raise TraceError(f"{path}: empty; expected a header line naming {', '.join(columns)}")
        names = [name.strip() for name in header]
        missing = [c for c in columns if c not in names and c not in optional]
        if missing:
            raise TraceError(
                f"{path}:1: the header lacks column {', '.join(missing)} (it has {shorten(','.join(names), 200)})"
            )
        where = {c: names.index(c) for c in columns if c in names}
        count = 0
        for fields in reader:
            lines.row()
            line = f"{path}:{reader.line_num}"
            if not fields or fields == [""]:
                continue
            count += 1
            if count > MAX_ROWS:
                raise TraceError(f"{line}: more than {MAX_ROWS} rows")
            if len(fields) != len(names):
                raise TraceError(f"{line}: {len(fields)} fields, the header names {len(names)}")
            row = {}
            for column, index in where.items():
                value = fields[index].strip()
                if len(value) > MAX_FIELD_CHARS:
                    raise TraceError(f"{line}: {column}: {len(value)} characters (at most {MAX_FIELD_CHARS})")
                row[column] = value
            yield line, row
    except csv.Error as exc:
        raise TraceError(f"{path}:{reader.line_num}: not valid CSV ({shorten(str(exc), 120)})") from None


class _Lines:
    """The physical lines of `stream` (any of `\n`, `\r\n`, `\r` ends one, as `csv` reads them), each at most
    `MAX_LINE_CHARS` and at most `MAX_LINES` of them, empty ones included: refused at the line that crosses, before
    it is cut into fields. A row is bounded alike: a quoted field holds line ends, so `csv` joins as many lines into
    one row as their quotes say (a header of 21 million columns, in 60,000-character lines joined by quotes, took
    1.7 GB); the lines read since the last row (`row`) are at most `MAX_LINE_CHARS` together."""

    def __init__(self, stream: io.TextIOWrapper, path: Path) -> None:
        self.stream, self.path, self.number, self.chars = stream, path, 0, 0

    def __iter__(self) -> _Lines:
        return self

    def row(self) -> None:
        """A row was read whole: the next begins."""
        self.chars = 0

    def __next__(self) -> str:
        line = self.stream.readline(MAX_LINE_CHARS + 2)
        if not line:
            raise StopIteration
        self.number += 1
        if self.number > MAX_LINES:
            raise TraceError(f"{self.path}:{self.number}: more than {MAX_LINES} lines")
        self.chars += len(line)
        if self.chars > MAX_LINE_CHARS and self.chars - len(line) + len(line.rstrip("\r\n")) > MAX_LINE_CHARS:
            what = "a line" if self.chars == len(line) else "a row (its quoted line ends joining lines)"
            raise TraceError(
                f"{self.path}:{self.number}: {what} longer than {MAX_LINE_CHARS} characters; the format's rows are a "
                "few hundred at most (other columns than its own are allowed, not megabytes of them)"
            )
        return line


def _int(line: str, row: dict[str, str], column: str, *, low: int = 0, high: int = MAX_VALUE) -> int:
    text = row.get(column, "")
    if not (text.isascii() and text.isdigit()):
        raise TraceError(f"{line}: {column}: '{shorten(text, 40)}' is not a whole number")
    value = int(text)
    if not low <= value <= high:
        raise TraceError(f"{line}: {column}: {value} is outside {low}..{high}")
    return value


def _name(line: str, row: dict[str, str], column: str) -> str:
    text = row[column]
    if not text or not text.isprintable():
        raise TraceError(f"{line}: {column}: '{shorten(text, 40)}' is not a name (empty or with control characters)")
    return text


def _model(line: str, column: str, text: str) -> str:
    """A GPU model as the `nvidia.com/gpu.product` label value both files are matched by: spaces become dashes, as
    GPU Feature Discovery labels product names (`Tesla V100-SXM2-16GB` is `Tesla-V100-SXM2-16GB`), in the node list
    and in the pods' `gpu_spec` alike. A model that is still no label value could match no node: refused."""
    value = text.replace(" ", "-")
    if not _LABEL_VALUE.fullmatch(value):
        raise TraceError(
            f"{line}: {column}: '{shorten(text, 40)}' is not a GPU model kubegpu can match (its spaces made dashes, a "
            "label value: at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit)"
        )
    return value


def read_nodes(path: Path) -> list[TraceNode]:
    """The node list: one `TraceNode` per row, names unique."""
    nodes: list[TraceNode] = []
    seen: dict[str, str] = {}
    gpus = 0
    for line, row in _rows(path, NODE_COLUMNS):
        if len(nodes) >= MAX_NODES:
            raise TraceError(f"{line}: more than {MAX_NODES} nodes")
        name = _name(line, row, "sn")
        if name in seen:
            raise TraceError(f"{line}: sn: node '{shorten(name)}' is listed twice (first at {seen[name]})")
        seen[name] = line
        model = row["model"]
        if not model.isprintable():
            raise TraceError(f"{line}: model: '{shorten(model, 40)}' has control characters")
        model = _model(line, "model", model) if model else ""
        node = TraceNode(
            name,
            _int(line, row, "cpu_milli"),
            _int(line, row, "memory_mib", high=MAX_MEMORY_MIB),
            _int(line, row, "gpu", high=1024),
            model,
        )
        gpus += node.gpus
        if gpus > MAX_GPUS:
            raise TraceError(f"{line}: gpu: the trace's nodes have more than {MAX_GPUS} GPUs")
        nodes.append(node)
    if not nodes:
        raise TraceError(f"{path}: no node rows")
    return nodes


def read_pods(path: Path, *, times: bool = False) -> list[TracePod]:
    """The pod list: one `TracePod` per row, names unique. `times`: creation and deletion times are required (the
    timeline); else they may be absent. An empty `deletion_time` means the pod is never deleted."""
    optional = frozenset() if times else frozenset({"creation_time", "deletion_time"})
    pods: list[TracePod] = []
    seen: dict[str, str] = {}
    for line, row in _rows(path, POD_COLUMNS, optional | frozenset({"gpu_spec"})):
        name = _name(line, row, "name")
        if name in seen:
            raise TraceError(f"{line}: name: pod '{shorten(name)}' is listed twice (first at {seen[name]})")
        seen[name] = line
        gpus = _int(line, row, "num_gpu", high=1024)
        # Read whatever `num_gpu` says (a value that is no number is a broken row, not one to skip); a pod of no
        # GPUs asks none, whatever thousandths its row gives.
        milli = _int(line, row, "gpu_milli", high=1000)
        if not gpus:
            milli = 0
        if gpus and not milli:
            raise TraceError(f"{line}: gpu_milli: 0 for a pod asking {gpus} GPU(s); 1..1000 thousandths of each")
        if gpus > 1 and milli != 1000:
            raise TraceError(f"{line}: gpu_milli: {milli} for a pod asking {gpus} GPUs; only one GPU may be shared")
        spec = row.get("gpu_spec", "")
        models = tuple(m.strip() for m in spec.split("|") if m.strip())
        if not all(m.isprintable() for m in models):
            raise TraceError(f"{line}: gpu_spec: '{shorten(spec, 40)}' has control characters")
        models = tuple(_model(line, "gpu_spec", m) for m in models)
        created, deleted = 0, None
        if "creation_time" in row:
            created = _int(line, row, "creation_time")
        if row.get("deletion_time"):
            deleted = _int(line, row, "deletion_time")
        pods.append(
            TracePod(
                name,
                _int(line, row, "cpu_milli"),
                _int(line, row, "memory_mib", high=MAX_MEMORY_MIB),
                gpus,
                milli,
                models,
                created,
                deleted,
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pod rows")
    return pods


# ------------------------------------------------------------------------------------------------------------
# Rows as manifests
# ------------------------------------------------------------------------------------------------------------


def node_document(node: TraceNode, *, share: bool = True) -> dict[str, object]:
    """The Node manifest of a trace node; `share`: offering shares as HAMi's device plugin advertises them."""
    allocatable = {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi", "pods": "1000"}
    labels = {PRODUCT_LABEL: node.model} if node.model else {}
    if node.gpus:
        labels["nvidia.com/gpu.count"] = str(node.gpus)
        allocatable[GPU] = str(node.gpus * (SPLIT if share else 1))
        if share:
            allocatable["nvidia.com/gpucores"] = str(100 * node.gpus)
            allocatable["nvidia.com/gpumem-percentage"] = str(100 * node.gpus)
    return {"kind": "Node", "metadata": {"name": node.name, "labels": labels}, "status": {"allocatable": allocatable}}


def pod_document(pod: TracePod, name: str, *, share: bool = True) -> dict[str, object]:
    """The Pod manifest of a trace pod under `name`; `share`: a fraction of a GPU asked as a HAMi share (else the
    whole GPU)."""
    limits = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    if pod.gpus:
        limits[GPU] = str(pod.gpus)
        if share and pod.gpus == 1 and pod.milli < 1000:
            # HAMi counts in whole percent: rounded up, so a share gets at least what the trace asks, and two pods
            # of 505 thousandths (51 % each) never fit one GPU together, as they would not in the paper's simulator.
            percent = str(-(-pod.milli // 10))
            limits["nvidia.com/gpucores"] = percent
            limits["nvidia.com/gpumem-percentage"] = percent
    spec: dict[str, object] = {"containers": [{"name": "main", "resources": {"limits": limits, "requests": limits}}]}
    if pod.models:
        term = {"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In", "values": list(pod.models)}]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    return {"kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


# ------------------------------------------------------------------------------------------------------------
# Arrivals and the allocation curve
# ------------------------------------------------------------------------------------------------------------


def experiment_order(pods: list[TracePod], capacity: int, inflate: float, seed: int) -> list[TracePod]:
    """The paper's arrivals: the trace in the seed's order, then random copies until the pods have asked for
    `inflate` x `capacity` GPU-milli."""
    if not 0 < inflate <= MAX_INFLATE:
        raise TraceError(f"--inflate: {inflate} is outside (0, {MAX_INFLATE:g}]")
    asking = [p for p in pods if p.gpu_milli]
    if not asking or not capacity:
        raise TraceError("no pod asks for a GPU or no node has one: the experiment inflates GPU requests")
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    asked = sum(p.gpu_milli for p in order)
    target = inflate * capacity
    while asked < target:
        if len(order) >= MAX_ARRIVALS:
            raise TraceError(f"--inflate: more than {MAX_ARRIVALS} pods would arrive; inflate less")
        pod = rng.choice(pods)
        order.append(pod)
        asked += pod.gpu_milli
    return order


@dataclass(slots=True)
class AllocationCurve:
    """The paper's accounting: per whole percent of arrived share, the sum and count of the allocated shares seen."""

    capacity: int
    sums: dict[int, float]
    counts: Counter[int]

    @classmethod
    def of(cls, capacity: int) -> AllocationCurve:
        return cls(capacity, {}, Counter())

    def add(self, arrived: int, allocated: int) -> None:
        percent = round(100 * arrived / self.capacity)
        self.sums[percent] = self.sums.get(percent, 0.0) + 100 * allocated / self.capacity
        self.counts[percent] += 1

    def points(self) -> list[tuple[int, float]]:
        """(arrived %, mean allocated %) for every percent some pod's arrival rounds to, ascending."""
        return [(p, self.sums[p] / self.counts[p]) for p in sorted(self.sums)]

    def at(self, percent: int) -> float | None:
        return self.sums[percent] / self.counts[percent] if self.counts[percent] else None

    def unreached(self) -> str:
        """Why there is no value at 100 %: the pods never asked that much, or one pod's ask leapt past it."""
        above = [p for p in self.sums if p > 100]
        if not above:
            return "the pods never asked for all of the GPU capacity"
        below = max((p for p in self.sums if p < 100), default=0)
        return f"no pod's arrival made the GPU capacity asked for 100% (it leapt from {below}% to {min(above)}%)"


@dataclass(slots=True)
class ReplayResult:
    mode: Mode
    nodes: int
    gpus: int
    pods: int  # arrivals replayed (copies included)
    curve: AllocationCurve
    events: list[dict[str, object]]  # scheduled/unschedulable/deleted, as `kubegpu simulate --json` words them
    scheduled: int = 0
    failed: int = 0
    deleted: int = 0
    seed: int | None = None
    inflate: float | None = None

    def summary(self) -> dict[str, object]:
        """The replay as one JSON-able document (`kubegpu simulate --trace-... --json`)."""
        full = self.curve.at(100)
        return {
            "mode": self.mode,
            "seed": self.seed,
            "inflate": self.inflate,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "pods": self.pods,
            "scheduled": self.scheduled,
            "failed": self.failed,
            "deleted": self.deleted,
            "allocatedAtFull": None if full is None else round(full, 2),
            "curve": [{"arrived": a, "allocated": round(v, 2)} for a, v in self.curve.points()],
        }


# `PodRequest`'s fields after namespace, name and uid, in its constructor's order (`_Requests`).
_REST = tuple(field.name for field in dataclasses.fields(PodRequest))[3:]


class _Requests:
    """The `PodRequest` of each arrival, parsed from its manifest once per shape (resources and models): the pods of
    a trace come in a few hundred shapes, and an arrival differs from its shape's first only by name (and uid). Each
    shape keeps its first request's other fields, in order: an arrival is made from them at once, as
    `dataclasses.replace` makes it field by field (half its ~5 us an arrival)."""

    LIMIT = 4096  # shapes remembered; a trace with more parses the others each time

    def __init__(self) -> None:
        self._shapes: dict[tuple[int, int, int, int, tuple[str, ...]], tuple[str, tuple[Any, ...]]] = {}

    def get(self, pod: TracePod, name: str) -> PodRequest:
        shape = (pod.cpu_milli, pod.memory_mib, pod.gpus, pod.milli, pod.models)
        known = self._shapes.get(shape)
        if known is not None:
            return PodRequest(known[0], name, pod_uid(NAMESPACE, name), *known[1])
        request, _ = pod_request(pod_document(pod, name))
        if len(self._shapes) < self.LIMIT:
            self._shapes[shape] = (request.namespace, tuple(getattr(request, field) for field in _REST))
        return request


def _timeline(pods: list[TracePod]) -> list[tuple[bool, int, TracePod]]:
    """(deleting, index, pod) in time order: deletions before creations of the same second, but a pod whose
    deletion is not after its creation leaves right after it arrives."""
    keyed: list[tuple[int, int, int, bool, TracePod]] = []
    for index, pod in enumerate(pods):
        keyed.append((pod.created, 1, index, False, pod))
        if pod.deleted is not None:
            if pod.deleted > pod.created:
                keyed.append((pod.deleted, 0, index, True, pod))
            else:
                keyed.append((pod.created, 2, index, True, pod))
    keyed.sort(key=lambda k: k[:3])
    return [(deleting, index, pod) for _, _, index, deleting, pod in keyed]


def replay(
    engine: Engine,
    nodes: list[TraceNode],
    pods: list[TracePod],
    mode: Mode,
    *,
    inflate: float = 1.3,
    seed: int = 42,
    keep_events: bool = True,
    latencies: list[float] | None = None,
    clock: Callable[[], float] | None = None,
) -> ReplayResult:
    """Add the trace's nodes to `engine` and replay its pods (module docstring), each scheduled at once or failed."""
    for node in nodes:
        try:
            engine.add_node(node_info(node_document(node)))
        except InputError as exc:
            raise TraceError(f"node {shorten(node.name)}: {exc}") from None
    capacity = sum(n.gpus for n in nodes) * 1000
    if capacity == 0:
        raise TraceError("no node of the trace has a GPU: the allocation curve counts GPU capacity")
    if mode == "experiment":
        arrivals: Iterable[tuple[bool, int, TracePod]] = (
            (False, i, p) for i, p in enumerate(experiment_order(pods, capacity, inflate, seed))
        )
    else:
        arrivals = _timeline(pods)
    result = ReplayResult(
        mode, len(nodes), capacity // 1000, 0, AllocationCurve.of(capacity), [],
        seed=seed if mode == "experiment" else None, inflate=inflate if mode == "experiment" else None,
    )  # fmt: skip
    seen: Counter[str] = Counter()
    trace_names = {pod.name for pod in pods}
    requests = _Requests()
    held: dict[int, tuple[str, int]] = {}  # arrival index -> (pod key, GPU-milli) of pods placed
    arrived = allocated = 0
    events = result.events
    for deleting, index, pod in arrivals:
        started = clock() if clock else 0.0
        if deleting:
            placed = held.pop(index, None)
            if placed is not None:
                released = engine.release(placed[0])
                allocated -= placed[1]
                result.deleted += 1
                if keep_events:
                    events.append({"pod": placed[0], "event": "deleted", "node": released.node if released else None})
            continue
        name = pod.name
        copies = seen[pod.name]
        if copies:
            # A copy is `NAME-copyN`; a trace may already name a pod so (`p-copy1`), which the engine would refuse
            # as placed twice: the next N is taken. Names made so never meet each other, only the trace's.
            name = f"{pod.name}-copy{copies}"
            while name in trace_names:
                copies += 1
                name = f"{pod.name}-copy{copies}"
        seen[pod.name] = copies + 1
        try:
            request = requests.get(pod, name)
        except InputError as exc:  # the reader's bounds keep every row a manifest; this names the pod if not
            raise TraceError(f"pod {shorten(name)}: {exc}") from None
        decision = engine.schedule(request)
        arrived += pod.gpu_milli
        result.pods += 1
        if decision.scheduled:
            held[index] = (request.key, pod.gpu_milli)
            allocated += pod.gpu_milli
            result.scheduled += 1
        else:
            result.failed += 1
        if latencies is not None and clock is not None:
            latencies.append(clock() - started)
        if keep_events:
            events.append(
                {
                    "pod": request.key,
                    "event": "scheduled" if decision.scheduled else "unschedulable",
                    "node": decision.node,
                    "reason": decision.reason,
                }
            )
        result.curve.add(arrived, allocated)
    return result
