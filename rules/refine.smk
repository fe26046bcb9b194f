def _previous(w, name):
    return f"{PLAN.run_dir(w.agent, w.platform, w.suite, w.problem)}/r{int(w.round) - 1}/{name}"


rule refine:
    """Round N from round N-1: repair from errors, optimise from recommendations, or carry."""
    input:
        candidate=lambda w: _previous(w, "candidate.json"),
        kernel=lambda w: _previous(w, "kernel.py"),
        compiled=lambda w: _previous(w, "compile.json"),
        verified=lambda w: _previous(w, "verify.json"),
        profiled=lambda w: _previous(w, "profile.json"),
        analysis=lambda w: _previous(w, "analysis.json"),
        problem=f"{ROOT}/problems/{{suite}}/{{problem}}.json",
        example=f"{ROOT}/examples/{{platform}}.json",
    output:
        kernel=f"{RUN}/r{{round}}/kernel.py",
        candidate=f"{RUN}/r{{round}}/candidate.json",
    params:
        code=PLAN.code["refine"],
        prompts=PLAN.generate_prompts(),
        agent=lambda w: PLAN.agent_digest(w.agent),
        settings=PLAN.settings_digest("policy", "rounds"),
    log:
        f"{ROOT}/logs/refine/{{agent}}/{{platform}}/{{suite}}/{{problem}}/r{{round}}.log",
    shell:
        "{STAGE} refine --config {CFG} --round {wildcards.round} --prev-dir $(dirname {input.candidate}) "
        "--problem-record {input.problem} --example-record {input.example} "
        "--out-dir $(dirname {output.kernel}) > {log} 2>&1"
