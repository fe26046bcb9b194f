"""``python -m kforge.verifier.judge_main``: the trusted judge of an on-device comparison
(``gpu_compare.judge_main``), started by the candidate worker before the candidate import."""

from kforge.verifier.gpu_compare import judge_main

judge_main()
