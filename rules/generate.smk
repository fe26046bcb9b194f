rule generate:
    """Round 0: the generation agent's first candidate."""
    input:
        problem=f"{ROOT}/problems/{{suite}}/{{problem}}.json",
        example=f"{ROOT}/examples/{{platform}}.json",
    output:
        kernel=f"{RUN}/r0/kernel.py",
        candidate=f"{RUN}/r0/candidate.json",
    params:
        code=PLAN.code["generate"],
        prompts=PLAN.generate_prompts(),
        agent=lambda w: PLAN.agent_digest(w.agent),
        policy=PLAN.config.policy,
    log:
        f"{ROOT}/logs/generate/{{agent}}/{{platform}}/{{suite}}/{{problem}}.log",
    shell:
        "{STAGE} generate --config {CFG} --agent {wildcards.agent} --platform {wildcards.platform} "
        "--suite {wildcards.suite} --problem {wildcards.problem} --problem-record {input.problem} "
        "--example-record {input.example} --out-dir $(dirname {output.kernel}) > {log} 2>&1"
