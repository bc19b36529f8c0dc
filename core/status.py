"""The result of one scheduling step, after the Kubernetes scheduler framework's `Status`.

Every refusal a user can hit travels as a `Status` with a code and sentences that say what to change. The codes
decide what the engine does next: `UNSCHEDULABLE` may change when pods leave (preemption or deletion could help),
`UNRESOLVABLE` will not (the node can never take this request), `ERROR` is a fault in kubegpu or a plugin.

Reasons quote what tenants wrote (the GPU model a pod asks for) and go to logs, Events, pod conditions and
terminals, so a `Status` keeps each reason, and gives its `message`, as `kubegpu.core.text.safe_text` makes it: one
line, control characters escaped, at most `MAX_TEXT_CHARS` characters; and at most `MAX_REASONS` reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from kubegpu.core.text import MAX_TEXT_CHARS, safe_text

__all__ = ["MAX_REASONS", "Code", "Status"]

MAX_REASONS = 64  # reasons one Status keeps: kube-scheduler's have a few; the rest are counted in the last


class Code(IntEnum):
    SUCCESS = 0
    UNSCHEDULABLE = 1
    UNRESOLVABLE = 2
    ERROR = 3


@dataclass(frozen=True, slots=True)
class Status:
    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str | None = None

    def __post_init__(self) -> None:
        if len(self.reasons) > MAX_REASONS:
            # A plugin's Status of 10,000 reasons: the engine counts each reason of each node's refusal, per pod
            # (a tenant's 20 pods over 50 nodes took 12.6 s, not 0.2 s); past the bound they are said by number.
            more = len(self.reasons) - MAX_REASONS + 1
            object.__setattr__(self, "reasons", (*self.reasons[: MAX_REASONS - 1], f"… ({more} more reasons)"))
        for reason in self.reasons:
            if len(reason) > MAX_TEXT_CHARS or not reason.isprintable():
                object.__setattr__(self, "reasons", tuple(safe_text(str(r)) for r in self.reasons))
                return

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS

    @property
    def message(self) -> str:
        return safe_text("; ".join(self.reasons)) if len(self.reasons) > 1 else "".join(self.reasons)

    @classmethod
    def success(cls) -> Status:
        return _SUCCESS

    @classmethod
    def unschedulable(cls, *reasons: str, plugin: str | None = None) -> Status:
        return cls(Code.UNSCHEDULABLE, reasons, plugin)

    @classmethod
    def unresolvable(cls, *reasons: str, plugin: str | None = None) -> Status:
        return cls(Code.UNRESOLVABLE, reasons, plugin)

    @classmethod
    def error(cls, *reasons: str, plugin: str | None = None) -> Status:
        return cls(Code.ERROR, reasons, plugin)


_SUCCESS = Status()
