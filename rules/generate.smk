def _transfer(w):
    """With transfer on, round 0 on platform B waits for platform A's best verified kernel."""
    source = PLAN.config.transfer.source_platform
    if not PLAN.config.transfer.enabled or w.platform == source:
        return []
    return [f"{PLAN.run_dir(w.agent, source, w.suite, w.problem)}/best.json"]


rule generate:
    """Round 0: the generation agent's first candidate."""
    input:
        problem=f"{ROOT}/problems/{{suite}}/{{problem}}.json",
        example=f"{ROOT}/examples/{{platform}}.json",
        transfer=_transfer,
    output:
        kernel=f"{RUN}/r0/kernel.py",
        candidate=f"{RUN}/r0/candidate.json",
    params:
        code=PLAN.code["generate"],
        prompts=PLAN.generate_prompts(),
        agent=lambda w: PLAN.agent_digest(w.agent),
        policy=PLAN.config.policy,
        transfer=lambda w: " ".join(f"--transfer-record {p}" for p in _transfer(w)),
    log:
        f"{ROOT}/logs/generate/{{agent}}/{{platform}}/{{suite}}/{{problem}}.log",
    shell:
        "{STAGE} generate --config {CFG} --agent {wildcards.agent} --platform {wildcards.platform} "
        "--suite {wildcards.suite} --problem {wildcards.problem} --problem-record {input.problem} "
        "--example-record {input.example} {params.transfer} --out-dir $(dirname {output.kernel}) > {log} 2>&1"
