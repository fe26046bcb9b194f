rule peaks:
    """The device's copy bandwidth and matmul rates, measured once per host with the machine
    to itself: the roofline check of every profile rests on them."""
    output:
        f"{ROOT}/host/peaks-{{platform}}.json",
    threads: workflow.cores
    resources:
        gpu=lambda w: 1 if w.platform in ("triton", "cuda") else 0,
    log:
        f"{ROOT}/logs/peaks-{{platform}}.log",
    shell:
        "{STAGE} peaks --config {CFG} --platform {wildcards.platform} --out {output} > {log} 2>&1"


rule profile:
    """Time and profile a verified candidate: evidence for the analysis agent. It shares the
    machine with other jobs (the report's numbers come from `select`, which does not)."""
    input:
        kernel=f"{RUN}/r{{r}}/kernel.py",
        verified=f"{RUN}/r{{r}}/verify.json",
        peaks=f"{ROOT}/host/peaks-{{platform}}.json",
    output:
        f"{RUN}/r{{r}}/profile.json",
    params:
        code=PLAN.code["profile"],
        settings=PLAN.settings_digest("profile"),
        suite=lambda w: PLAN.suite_digest(w.suite),
    resources:
        gpu=lambda w: 1 if w.platform in ("triton", "cuda") else 0,
    log:
        f"{RUN}/r{{r}}/profile.log",
    wildcard_constraints:
        r=r"[0-9]+",
    shell:
        "{STAGE} profile --config {CFG} --platform {wildcards.platform} --suite {wildcards.suite} "
        "--problem {wildcards.problem} --kernel {input.kernel} --verify-record {input.verified} "
        "--out {output} > {log} 2>&1"
