"""Bounds on what one input may make kubegpu build, shared by the engine and every plugin.

A Node object, an advertised inventory or a simulator file can claim any number of devices; per-device structures
(bitmasks, ring windows, id lists) would then cost time and memory in proportion to a number someone else chose.
The largest real accelerator nodes have 16 Neuron devices (64 NeuronCores), 8 to 16 GPUs or a few Intel cards, so
kubegpu handles at most `MAX_DEVICES_PER_NODE` devices of one plugin per node; a node that claims more gets a reason
naming the node and the count for that plugin's pods. The bound is held where every plugin passes, not left to each:
the engine refuses an advertised inventory over it before the plugin sees it (`Engine.add_node`), the kit's base
refuses a device list over it whatever its source (`kubegpu.core.kit.WholeDevicePlugin`), a count label is judged on
its text before anything is built from it (`bounded_count`: `999999999999` costs nothing), and a plugin's picture of
more devices is a wrong answer at the checked boundary (`kubegpu.core.answers`).

A Node's `status.images` (read for kube-scheduler's ImageLocality score) can list thousands of names. The kubelet
reports 50 images by default (`--node-status-max-images`), each under a few names (tags and digests), so kubegpu
keeps the first `MAX_NODE_IMAGE_NAMES` names a node lists (the kubelet lists the largest images first) and skips
names longer than `MAX_IMAGE_NAME_LENGTH` characters, which no valid image reference is (a repository of at most
255 characters, a tag of 128, a digest): a hostile Node costs at most a few hundred KiB, never what it claims.
"""

from __future__ import annotations

__all__ = [
    "MAX_DEVICES_PER_NODE",
    "MAX_IMAGE_NAME_LENGTH",
    "MAX_NODE_IMAGE_NAMES",
    "bounded_count",
    "check_device_count",
]

MAX_DEVICES_PER_NODE = 1024
MAX_NODE_IMAGE_NAMES = 256  # image names kept per node (and names looked at: a list of junk is not read to its end)
MAX_IMAGE_NAME_LENGTH = 512


def check_device_count(node: str, what: str, count: int) -> None:
    """Raise `ValueError` when `count` devices of `what` on `node` are more than kubegpu handles."""
    if count > MAX_DEVICES_PER_NODE:
        raise ValueError(
            f"node {node} claims {count} {what}; kubegpu handles at most {MAX_DEVICES_PER_NODE} devices of one kind "
            "per node"
        )


def bounded_count(text: str, what: str) -> int | None:
    """The device count `text` writes in ASCII digits (a count label's value), or None when it is not one. Raises
    `ValueError` naming `what` when the count is over `MAX_DEVICES_PER_NODE`, judged on the digits before converting
    them, so whatever a label claims costs nothing to refuse."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(MAX_DEVICES_PER_NODE)) or int(digits) > MAX_DEVICES_PER_NODE:
        shown = digits if len(digits) <= 24 else f"{digits[:24]}... ({len(digits)} digits)"
        raise ValueError(
            f"{what} claims {shown} devices; kubegpu handles at most {MAX_DEVICES_PER_NODE} devices of one kind "
            "per node"
        )
    return int(digits)
