"""KForge: synthesize fast, verified compute kernels from PyTorch references."""

__version__ = "0.1.0"
