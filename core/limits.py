"""Bounds on what one input may make kubegpu build, shared by the engine and every plugin.

A Node object, an advertised inventory or a simulator file can claim any number of devices; per-device structures
(bitmasks, ring windows, id lists) would then cost time and memory in proportion to a number someone else chose.
The largest real accelerator nodes have 16 Neuron devices (64 NeuronCores), 8 to 16 GPUs or a few Intel cards, so
kubegpu handles at most `MAX_DEVICES_PER_NODE` devices of one plugin per node, and a plugin refuses a node that
claims more with a reason naming the node and the count (the engine turns it into the reason its pods get).

A Node's `status.images` (read for kube-scheduler's ImageLocality score) can list thousands of names. The kubelet
reports 50 images by default (`--node-status-max-images`), each under a few names (tags and digests), so kubegpu
keeps the first `MAX_NODE_IMAGE_NAMES` names a node lists (the kubelet lists the largest images first) and skips
names longer than `MAX_IMAGE_NAME_LENGTH` characters, which no valid image reference is (a repository of at most
255 characters, a tag of 128, a digest): a hostile Node costs at most a few hundred KiB, never what it claims.
"""

from __future__ import annotations

__all__ = ["MAX_DEVICES_PER_NODE", "MAX_IMAGE_NAME_LENGTH", "MAX_NODE_IMAGE_NAMES", "check_device_count"]

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
