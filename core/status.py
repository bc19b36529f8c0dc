"""The result of one scheduling step, after the Kubernetes scheduler framework's `Status`.

Every refusal a user can hit travels as a `Status` with a code and sentences that say what to change. The codes
decide what the engine does next: `UNSCHEDULABLE` may change when pods leave (preemption or deletion could help),
`UNRESOLVABLE` will not (the node can never take this request), `ERROR` is a fault in kubegpu or a plugin.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = ["Code", "Status"]


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

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS

    @property
    def message(self) -> str:
        return "; ".join(self.reasons)

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
