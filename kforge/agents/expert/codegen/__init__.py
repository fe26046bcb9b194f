"""Code generation: a :class:`~kforge.agents.expert.plan.kernels.Program` and its knobs as a
candidate module per platform, behind one protocol (:mod:`.backend`: the ``Backend`` and the
registry): :mod:`.triton`, :mod:`.cpu`, :mod:`.cuda`. Each renders the op table through its
own column (:mod:`.optable`); the C++ and CUDA backends share a C-style emitter
(:mod:`.cstyle`); :mod:`.candidate` is the ``ModelNew`` every backend shares."""
