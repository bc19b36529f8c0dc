"""The node side: the CRI shim in front of containerd and the device advertiser."""
