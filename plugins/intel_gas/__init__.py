"""Intel GPUs with GPU Aware Scheduling semantics: per-card shares of every `gpu.intel.com/*` resource."""
