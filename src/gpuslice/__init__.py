"""gpuslice — share NVIDIA GPUs safely: slices with hard memory limits, compute shares and priorities."""

__version__ = "0.1.0"
