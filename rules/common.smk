# Shared set-up: the validated config, the run grid and the digests used as params.
import os

from kforge.workflow import plan_or_exit

configfile: os.path.join(workflow.basedir, "kforge.yaml")

PLAN = plan_or_exit(config)  # a bad config: one line "kforge: ..." and exit 2, no traceback
ROOT = PLAN.root
PY = PLAN.python
CFG = PLAN.resolved
RUN = ROOT + "/runs/{agent}/{platform}/{suite}/{problem}"
STAGE = f"{PY} -m kforge.stages"


wildcard_constraints:
    agent=r"[A-Za-z0-9_-]+",
    platform=r"[A-Za-z0-9_.-]+",
    suite=r"[A-Za-z0-9_-]+",
    problem=r"[^/]+",
    round=r"[1-9][0-9]*",
