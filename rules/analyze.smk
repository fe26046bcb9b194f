rule analyze:
    """The performance-analysis agent reads the profile and recommends the next change."""
    input:
        candidate=f"{RUN}/r{{r}}/candidate.json",
        kernel=f"{RUN}/r{{r}}/kernel.py",
        profile=f"{RUN}/r{{r}}/profile.json",
    output:
        f"{RUN}/r{{r}}/analysis.json",
    params:
        code=PLAN.code["analyze"],
        prompts=PLAN.analyze_prompts(),
        agent=lambda w: PLAN.agent_digest(w.agent),
        policy=PLAN.config.policy,
    log:
        f"{RUN}/r{{r}}/analysis.log",
    wildcard_constraints:
        r=r"[0-9]+",
    shell:
        "{STAGE} analyze --config {CFG} --candidate {input.candidate} --kernel {input.kernel} "
        "--profile-record {input.profile} --out {output} > {log} 2>&1"
