"""The Triton backend: the four kernel kinds as ``@triton.jit`` kernels (:mod:`.render`,
:mod:`.gemm`), expressions (:mod:`.expr`), CUDA graph replay (:mod:`.graph`)."""
