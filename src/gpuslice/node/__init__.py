"""gpuslice node part."""
