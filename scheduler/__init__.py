"""The scheduling engine and its front-ends: the simulator, the custom scheduler and the extender."""
