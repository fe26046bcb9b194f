"""The CUDA backend: the four kernel kinds as CUDA C++ kernels in one translation unit
(:mod:`.render`: pointwise, row, scan; :mod:`.gemm`), expressions through the shared C-style
emitter (:mod:`..cstyle`) and this backend's op table (:mod:`.ops`), the candidate module the
cuda platform builds (:mod:`.backend`)."""
