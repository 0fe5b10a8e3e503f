"""gpuslice placement part."""
