"""NVIDIA GPUs: model selection, minimum memory, and NVLink/NVSwitch-aware multi-GPU sets."""
