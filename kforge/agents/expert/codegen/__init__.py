"""Code generation: a :class:`~kforge.agents.expert.plan.kernels.Program` and its knobs as a
candidate module per platform (:mod:`.triton`, :mod:`.cpu`); :mod:`.candidate` is the
``ModelNew`` every backend shares."""
