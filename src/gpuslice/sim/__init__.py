"""gpuslice sim part."""
