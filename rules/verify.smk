rule verify:
    """Run the candidate against its reference in the sandboxed verifier."""
    input:
        kernel=f"{RUN}/r{{r}}/kernel.py",
        compiled=f"{RUN}/r{{r}}/compile.json",
        problem=f"{ROOT}/problems/{{suite}}/{{problem}}.json",
    output:
        f"{RUN}/r{{r}}/verify.json",
    params:
        code=PLAN.code["verify"],
        settings=PLAN.settings_digest("policy", "verify"),
        suite=lambda w: PLAN.suite_digest(w.suite),
    log:
        f"{RUN}/r{{r}}/verify.log",
    wildcard_constraints:
        r=r"[0-9]+",
    shell:
        "{STAGE} verify --config {CFG} --platform {wildcards.platform} --suite {wildcards.suite} "
        "--problem {wildcards.problem} --kernel {input.kernel} --compile-record {input.compiled} "
        "--problem-record {input.problem} --out {output} > {log} 2>&1"
