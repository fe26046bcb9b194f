"""The Triton backend (:mod:`.backend`): the four kernel kinds as ``@triton.jit`` kernels
(:mod:`.render`, :mod:`.gemm` with its tiles per precision step in :mod:`.tiles`),
expressions through its op table (:mod:`.expr`, :mod:`.ops`), CUDA graph replay (:mod:`.graph`)."""
