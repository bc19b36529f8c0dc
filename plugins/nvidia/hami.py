"""HAMi's node registration, for clusters whose nodes still run HAMi's NVIDIA device plugin without GPU Feature
Discovery.

HAMi's device plugin offers the kubelet `nvidia.com/gpu` = physical GPUs x its split count (`deviceSplitCount`, 10)
and describes each physical GPU in a node annotation of its own, `hami.io/node-nvidia-register`, rewritten every 30
seconds. Two shapes of it are in use:

* older releases: `UUID,split count,memory MiB,cores,type,numa,healthy` per GPU (or the same with `,index,mode`
  after it: 9 fields), each entry ended by `:`;
* newer releases: a JSON list of `{"id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "health",
  ...}` objects, where Go leaves out every field at its zero value (no `index` for GPU 0, no `health` for a GPU
  that is not healthy).

The type is `NVIDIA-` and NVML's name (`NVIDIA-NVIDIA A100-SXM4-80GB`, `NVIDIA-Tesla T4`); `model` gives it without
HAMi's prefix, as NVML and GPU Feature Discovery name it.

The handshake, `hami.io/node-handshake` (`hami.io/node-handshake-nvidia` in HAMi's protocol document): HAMi's
scheduler writes `Requesting_<its time>` and the device plugin answers `Reported <its time>` when it registers;
HAMi's scheduler holds the node's devices invalid while a request older than 60 seconds goes unanswered, and once it
wrote `Deleted_...`. kubegpu writes no request, so only one left by HAMi's scheduler (still running, or removed
while the device plugin was down) can go stale; kubegpu judges it as HAMi does (`handshake_problem`), against its
own clock (HAMi's scheduler writes its time without a zone: read as UTC), whenever it reads the node.

The annotations are the node's text, written by whoever may patch the Node: one kubegpu cannot read (malformed,
over `MAX_REGISTRATION_CHARS` or `MAX_REGISTERED_GPUS`) is a reason (`read_registration` returns it), never an
exception, and costs at most what its bounded length does to parse.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from kubegpu.core.text import safe_text

__all__ = [
    "HANDSHAKE_KEYS",
    "REGISTER_KEY",
    "RegisteredGPU",
    "handshake_problem",
    "read_registration",
    "registration_digest",
]

REGISTER_KEY = "hami.io/node-nvidia-register"
HANDSHAKE_KEYS = ("hami.io/node-handshake", "hami.io/node-handshake-nvidia")  # the first present is read
MAX_REGISTRATION_CHARS = 64 * 1024  # a 16-GPU node's JSON with MIG profiles is a few KiB
MAX_REGISTERED_GPUS = 64  # the largest real nodes have 16 GPUs
HANDSHAKE_TIMEOUT = timedelta(seconds=60)  # HAMi's scheduler: a request unanswered this long, the devices invalid
_PREFIX = "NVIDIA-"  # HAMi's device plugin writes the type as "NVIDIA-" + NVML's name
_INT = re.compile(r"[+-]?[0-9]{1,10}")  # Go's ParseInt(s, 10, 32) and Atoi, within int32
_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
_BOOLS.update({"0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False})
_REQUEST_TIMES = ("%Y-%m-%d %H:%M:%S", "%Y.%m.%d %H:%M:%S")  # HAMi's scheduler, newer and older releases


@dataclass(frozen=True, slots=True)
class RegisteredGPU:
    """One physical GPU as HAMi's device plugin registered it: `split` the share slots it offers, `memory_mib` its
    memory (HAMi's `deviceMemoryScaling` > 1 inflates it), `model` NVML's name, `index` where the entry gives one."""

    uuid: str
    split: int
    memory_mib: int
    model: str | None
    healthy: bool
    index: int | None = None


class _Entry(BaseModel):
    """One entry of the JSON shape; fields at Go's zero value are absent. Others (`migProfiles`, `custominfo`) are
    not read."""

    model_config = ConfigDict(extra="ignore", strict=True)

    id: str = Field(default="", max_length=256)
    index: int = Field(default=0, ge=0, le=MAX_REGISTERED_GPUS * 16)
    count: int = Field(default=0, ge=0, le=1 << 31)
    devmem: int = Field(default=0, ge=0, le=1 << 31)
    type: str = Field(default="", max_length=256)
    health: bool = False


_ENTRIES = TypeAdapter(list[_Entry])


def model_of(kind: str) -> str | None:
    """NVML's name from HAMi's type (`NVIDIA-Tesla T4` -> `Tesla T4`), None where it names none."""
    kind = kind.strip()
    if kind.startswith(_PREFIX) and kind[len(_PREFIX) :].strip():
        kind = kind[len(_PREFIX) :].strip()
    return kind or None


def read_registration(text: str) -> tuple[RegisteredGPU, ...] | str:
    """The GPUs `hami.io/node-nvidia-register` lists, in its order, or why they cannot be read (a sentence naming
    the annotation)."""
    if len(text) > MAX_REGISTRATION_CHARS:
        return f"annotation {REGISTER_KEY} is {len(text)} characters long, more than the {MAX_REGISTRATION_CHARS} read"
    text = text.strip()
    if not text:
        return f"annotation {REGISTER_KEY} is empty"
    gpus = _read_json(text) if text.startswith("[") else _read_entries(text)
    if isinstance(gpus, str):
        return f"annotation {REGISTER_KEY}: {gpus}"
    if not gpus:
        return f"annotation {REGISTER_KEY} lists no GPU"
    if len(gpus) > MAX_REGISTERED_GPUS:
        return f"annotation {REGISTER_KEY} lists {len(gpus)} GPUs, more than the {MAX_REGISTERED_GPUS} read"
    return gpus


def _read_json(text: str) -> tuple[RegisteredGPU, ...] | str:
    try:
        entries = _ENTRIES.validate_json(text)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        return safe_text(f"not a list of HAMi's devices ({where}: {error['msg']})", 300)
    return tuple(RegisteredGPU(e.id, e.count, e.devmem, model_of(e.type), e.health, e.index) for e in entries)


def _read_entries(text: str) -> tuple[RegisteredGPU, ...] | str:
    if ":" not in text:
        return "neither a JSON list nor entries ended by ':'"
    entries = [entry for entry in text.split(":") if entry]
    if len(entries) > MAX_REGISTERED_GPUS:
        return f"{len(entries)} entries, more than the {MAX_REGISTERED_GPUS} GPUs read"
    gpus = []
    for number, entry in enumerate(entries):
        fields = entry.split(",")
        if len(fields) not in (7, 9):
            return f"entry {number + 1} has {len(fields)} fields, 7 or 9 are HAMi's"
        uuid, split, memory, _cores, kind, numa, health = fields[:7]
        numbers = [split, memory, numa, *fields[7:8]]
        if not all(_INT.fullmatch(n) for n in numbers) or health not in _BOOLS:
            return safe_text(f"entry {number + 1} ({entry}) is not uuid,count,MiB,cores,type,numa,healthy", 300)
        if int(split) < 0 or int(memory) < 0 or (len(fields) == 9 and int(fields[7]) < 0):
            return f"entry {number + 1} has a negative number"
        index = int(fields[7]) if len(fields) == 9 else None
        gpus.append(RegisteredGPU(uuid, int(split), int(memory), model_of(kind), _BOOLS[health], index))
    return tuple(gpus)


def handshake(annotations: Mapping[str, str]) -> str | None:
    for key in HANDSHAKE_KEYS:
        if key in annotations:
            return annotations[key]
    return None


def handshake_problem(annotations: Mapping[str, str], now: datetime) -> str | None:
    """Why HAMi's scheduler would hold the node's registered devices invalid now, or None (no handshake, or one the
    device plugin answered: `Reported ...`)."""
    value = handshake(annotations)
    if value is None:
        return None
    value = value.strip()
    if value.startswith("Deleted"):
        return f"HAMi's scheduler marked the node's devices deleted ({HANDSHAKE_KEYS[0]}: {safe_text(value, 60)})"
    if not value.startswith("Requesting"):
        return None
    stamp = value.partition("_")[2].strip()
    asked = None
    for form in _REQUEST_TIMES:
        try:
            asked = datetime.strptime(stamp[:32], form).replace(tzinfo=timezone.utc)
            break
        except ValueError:
            continue
    if asked is None:
        return f"HAMi's handshake request has no time HAMi can read ({HANDSHAKE_KEYS[0]}: {safe_text(value, 60)})"
    if now - asked > HANDSHAKE_TIMEOUT:
        return (
            f"HAMi's device plugin has not answered the handshake requested at {asked:%Y-%m-%d %H:%M:%S} UTC "
            f"(more than {HANDSHAKE_TIMEOUT.seconds} s ago)"
        )
    return None


def registration_digest(annotations: Mapping[str, str], now: datetime) -> tuple[str | None, bool]:
    """What of a node's HAMi annotations a plugin's state reads: the registration (as written, or a marker past
    `MAX_REGISTRATION_CHARS`) and whether the handshake is stale now. The engine compares it where it compares
    labels and allocatable (node classes, the wake of pending pods), so HAMi's device plugin rewriting its
    handshake every 30 seconds neither splits a class nor wakes the pending pods."""
    text = annotations.get(REGISTER_KEY)
    if text is not None and len(text) > MAX_REGISTRATION_CHARS:
        text = f"(over {MAX_REGISTRATION_CHARS} characters: {len(text)})"
    return text, handshake_problem(annotations, now) is not None
