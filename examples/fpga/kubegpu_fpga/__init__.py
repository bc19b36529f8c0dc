"""An example third-party kubegpu plugin: whole FPGA cards (`example.com/fpga`) and the bitstream on them.

The distribution registers two modules through kubegpu's entry-point groups: `kubegpu_fpga.scheduler` (the
DeviceScheduler hooks: which node can take a pod, which cards it gets) and `kubegpu_fpga.device` (the Device
hooks: find `/dev/fpga*`, advertise them, hand the allocated cards to a container). Both sides share the names
defined here.
"""

from __future__ import annotations

import re

__all__ = [
    "BITSTREAM_ANNOTATION",
    "BITSTREAM_LABEL",
    "CARD_PATTERN",
    "COUNT_LABEL",
    "NAME",
    "RESOURCE",
    "card_index",
]

NAME = "fpga"
RESOURCE = "example.com/fpga"
COUNT_LABEL = "example.com/fpga.count"
BITSTREAM_LABEL = "example.com/fpga.bitstream"
BITSTREAM_ANNOTATION = "example.com/fpga-bitstream"

# Card ids are the device file names: `fpga0`, `fpga1`, ...
CARD_PATTERN = re.compile(r"fpga(0|[1-9][0-9]*)")


def card_index(card: str) -> int | None:
    """The number of a card id (`fpga3` -> 3), or None when the string is not a card id."""
    match = CARD_PATTERN.fullmatch(card)
    return int(match.group(1)) if match else None
