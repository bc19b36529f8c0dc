"""kubegpu: topology-aware scheduling of accelerator devices on Kubernetes."""

from importlib_metadata import PackageNotFoundError, version

try:
    __version__ = version("kubegpu")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
