"""The CPU backend: the four kernel kinds as one C++ / OpenMP translation unit
(:mod:`.render`, :mod:`.gemm`), expressions (:mod:`.expr`)."""
