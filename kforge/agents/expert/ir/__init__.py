"""The op-graph IR: the captured ATen graph as a small set of ops over symbolic shapes
(:mod:`.graph`), one handler per ATen overload (:mod:`.aten`, :mod:`.inplace`), and the
algebraic rewrites applied before planning (:mod:`.rewrites`)."""
