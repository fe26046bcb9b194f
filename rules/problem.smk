rule problem:
    """Load and validate one problem; record FLOPs, bytes and degenerate-reference flags."""
    input:
        lambda w: f"{PLAN.config.suites[w.suite].path}/{w.problem}.py",
    output:
        f"{ROOT}/problems/{{suite}}/{{problem}}.json",
    params:
        code=PLAN.code["problem"],
        suite=lambda w: PLAN.suite_digest(w.suite),
    log:
        f"{ROOT}/logs/problem/{{suite}}/{{problem}}.log",
    shell:
        "{STAGE} problem --config {CFG} --suite {wildcards.suite} --problem {wildcards.problem} "
        "--out {output} > {log} 2>&1"
