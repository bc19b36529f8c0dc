"""The FPGA plugin, scheduler side: whole `example.com/fpga` cards and one rule about what is loaded on them.

A node's cards come from its advertised inventory (`kubegpu.io/devices`, written by `kubegpu advertise` with
this distribution's device side) or, without an advertiser, from the label `example.com/fpga.count`. All cards
of a node carry the bitstream named by the node label `example.com/fpga.bitstream`. A pod that names a
bitstream in the annotation `example.com/fpga-bitstream` fits only nodes with that bitstream; a pod that names
none may use any node, and prefers nodes with no bitstream loaded, which keeps those for the pods that need
them. Cards are independent (no topology), so a container gets the lowest free card ids: the kit's default.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from kubegpu.core.kit import Refused, WholeDeviceNodeState, WholeDevicePlugin, WholeDevicePodState
from kubegpu.core.limits import bounded_count
from kubegpu.core.models import DeviceInfo, NodeInfo, PodRequest
from kubegpu_fpga import BITSTREAM_ANNOTATION, BITSTREAM_LABEL, COUNT_LABEL, RESOURCE, card_index

__all__ = ["FpgaScheduler", "cards_from_label", "plugin"]

log = logging.getLogger(__name__)

# A bitstream name is used as a label value, so it follows the label-value syntax.
BITSTREAM_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
SCORE_MATCHED = 100.0  # the pod named a bitstream and the node has it, or the node has none loaded
SCORE_LOADED_UNUSED = 50.0  # the pod needs no bitstream but the node's cards are loaded with one


class FpgaScheduler(WholeDevicePlugin):
    """Cards from the inventory or the count label; `extra` of a node is its bitstream, of a request the wanted one."""

    resources = (RESOURCE,)
    noun = "cards"

    def devices(self, node: NodeInfo) -> tuple[Sequence[DeviceInfo], Any] | None:
        bitstream = node.labels.get(BITSTREAM_LABEL) or None
        inventory = node.inventories.get(self.name)
        if inventory is not None:
            numbered = sorted((index, d) for d in inventory.devices if (index := card_index(d.id)) is not None)
            return [d for _, d in numbered], bitstream
        return [DeviceInfo(id=card) for card in cards_from_label(node.labels.get(COUNT_LABEL))], bitstream

    def read(self, pod: PodRequest) -> str | None:
        wanted = pod.annotations.get(BITSTREAM_ANNOTATION)
        if wanted is not None and not BITSTREAM_NAME.fullmatch(wanted):
            raise Refused(
                f"annotation {BITSTREAM_ANNOTATION} must name a bitstream (letters, digits, '-', '_', '.'), "
                f"got {wanted!r}"
            )
        return wanted

    def eligible(self, state: WholeDeviceNodeState, request: WholeDevicePodState) -> tuple[int, str | None]:
        if request.extra is not None and request.extra != state.extra:
            return 0, f"node(s) didn't have FPGA bitstream {request.extra!r} (annotation {BITSTREAM_ANNOTATION})"
        return state.healthy, None

    def score(self, state: WholeDeviceNodeState, request: WholeDevicePodState, chosen: Sequence[int]) -> float:
        return SCORE_LOADED_UNUSED if request.extra is None and state.extra is not None else SCORE_MATCHED

    def fields(
        self, state: WholeDeviceNodeState, request: WholeDevicePodState, chosen: Sequence[int]
    ) -> dict[str, Any]:
        return {"bitstream": state.extra} if state.extra else {}


def cards_from_label(value: str | None) -> tuple[str, ...]:
    """`fpga0`..`fpga<n-1>` from the `example.com/fpga.count` label; none when it is absent or not a count. A count
    over kubegpu's bound (`kubegpu.core.limits.MAX_DEVICES_PER_NODE`) raises `ValueError`, judged on the text before
    any card is made."""
    if value is None:
        return ()
    count = bounded_count(value, f"label {COUNT_LABEL}")
    if count is None:
        log.warning("ignoring label %s=%r: not a card count", COUNT_LABEL, value[:64])
        return ()
    return tuple(f"fpga{i}" for i in range(count))


plugin = FpgaScheduler()
