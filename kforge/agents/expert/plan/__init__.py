"""Planning: the IR grouped into kernels (:mod:`.planner`, checked by index lowering in
:mod:`.lower`) as a loop-level :class:`~.kernels.Program`; the knobs of each round
(:mod:`.rounds`)."""
