"""Intel GPUs with GPU Aware Scheduling semantics: per-card shares of every `gpu.intel.com/*` resource.

The names both sides share (the plugin's name, the resources and the pod annotations GAS defines) live here;
`scheduler.py` keeps the per-card books, `placement.py` holds the pure placement rule, `tiles.py` the tiles (which
ones, how the allocation names them, Level Zero's mask), `device.py` the node side.
"""

from __future__ import annotations

NAME = "intel-gas"
RESOURCES = ["gpu.intel.com/*"]

PREFIX = "gpu.intel.com/"
I915 = "gpu.intel.com/i915"
XE = "gpu.intel.com/xe"
COUNT_RESOURCES = (I915, XE)  # "on how many cards": one unit per chosen card
MILLICORES = "gpu.intel.com/millicores"
MEMORY = "gpu.intel.com/memory.max"
TILES = "gpu.intel.com/tiles"
ALLOW_ANNOTATION = "gas-allow"
DENY_ANNOTATION = "gas-deny"
TS_ANNOTATION = "gas-ts"
CARDS_ANNOTATION = "gas-container-cards"
TILES_ANNOTATION = "gas-container-tiles"
SAME_GPU_ANNOTATION = "gas-same-gpu"
# GAS's placement asks kubegpu does not follow; a pod carrying one is refused rather than placed without it.
UNSUPPORTED_ANNOTATIONS = {
    "gas-allocate-xelink": "cards connected by Xe Link",
    "gas-allocate-single-numa": "cards of one NUMA node",
}
SAME_GPU_FORBIDDEN = (TILES, "gpu.intel.com/i915_monitoring", "gpu.intel.com/xe_monitoring")
# GAS leaves a pod requesting gpu.intel.com/* without i915/xe to the default scheduler; kubegpu refuses it unless
# this environment variable says `ignore` (`kubegpu extender --intel-without-i915 ignore` sets it).
WITHOUT_I915_ENV = "KUBEGPU_INTEL_WITHOUT_I915"
