"""The node agent: the scheduler and kubelet of the emulated nodes."""
