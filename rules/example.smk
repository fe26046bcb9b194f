rule example:
    """A platform's one-shot example (refs/<platform>/) and whether it runs on this host."""
    output:
        f"{ROOT}/examples/{{platform}}.json",
    params:
        code=PLAN.code["example"],
        refs=lambda w: PLAN.refs_digest(w.platform),
    log:
        f"{ROOT}/logs/example/{{platform}}.log",
    shell:
        "{STAGE} example --config {CFG} --platform {wildcards.platform} --out {output} > {log} 2>&1"
