"""Planning: the IR grouped into kernels (:mod:`.planner`, :mod:`.regions`, :mod:`.rows`;
each fusion checked by index lowering, :mod:`.lower` over :mod:`.expr`) as a loop-level
:class:`~.kernels.Program`; the precision ladder (:mod:`.precision`), the typed knobs
(:mod:`.knobs`), each round's knobs (:mod:`.rounds`) and the plan record (:mod:`.record`)."""
