"""gpuslice kube part."""
