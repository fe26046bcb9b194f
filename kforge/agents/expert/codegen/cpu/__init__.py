"""The CPU backend (:mod:`.backend`): the four kernel kinds as one C++ / OpenMP translation
unit (:mod:`.render`, :mod:`.gemm`), expressions through the shared C-style emitter and this
backend's op table (:mod:`.ops`)."""
