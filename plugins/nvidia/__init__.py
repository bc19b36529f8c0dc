"""NVIDIA GPUs: whole GPUs, shares, MIG devices, model selection, NVLink cube-mesh and NVSwitch sets.

The names both sides share live here; `scheduler.py` places pods, `topology.py` and `mig.py` hold the pure placement
rules, `device.py` (with `mig_node.py`) the node side.
"""

from __future__ import annotations

NAME = "nvidia"
RESOURCE = "nvidia.com/gpu"
RESOURCES = [RESOURCE]
# NVIDIA GPU Feature Discovery's labels, read by the scheduler side and written by the advertiser.
PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
MEMORY_LABEL = "nvidia.com/gpu.memory"
