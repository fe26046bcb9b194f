def _rounds(w, names):
    return [f"{d}/{n}" for d in PLAN.round_dirs(w.agent, w.platform, w.suite, w.problem) for n in names]


rule select:
    """Best verified round, re-timed against eager and torch.compile in one process; the ship rule."""
    input:
        rounds=lambda w: _rounds(w, ("kernel.py", "candidate.json", "verify.json", "profile.json", "analysis.json")),
        peaks=f"{ROOT}/host/peaks-{{platform}}.json",
        problem=f"{ROOT}/problems/{{suite}}/{{problem}}.json",
        warm=f"{ROOT}/warm/{{platform}}/{{suite}}.json",
    output:
        f"{RUN}/best.json",
    params:
        code=PLAN.code["select"],
        settings=PLAN.settings_digest("profile", "policy"),
        dirs=lambda w: " ".join(PLAN.round_dirs(w.agent, w.platform, w.suite, w.problem)),
    # The report's timings share nothing: the re-timing's window holds the host's lease and the
    # device's exclusively (kforge/verifier/device_lease.py), so a select takes a profile's share
    # of the cores; most selects only read their round's profile (~1 s), and with every core each
    # waited for the whole run to drain before it started.
    threads: profile_threads
    log:
        f"{RUN}/select.log",
    shell:
        "{STAGE} select --config {CFG} --inputs {params.dirs} --problem-record {input.problem} --warm-record {input.warm} --out {output} > {log} 2>&1"


rule tables:
    """One Parquet table per stage, plus agent transcripts and lineage edges."""
    input:
        PLAN.records(),
    output:
        [f"{ROOT}/tables/{t}.parquet" for t in
         ("candidates", "compiles", "verifications", "profiles", "analyses", "transcripts", "lineage")],
    log:
        f"{ROOT}/logs/tables.log",
    shell:
        "{STAGE} tables --config {CFG} --inputs {input} --out-dir {ROOT}/tables > {log} 2>&1"


rule report:
    """One row per agent x platform x problem (status, speedups, policy, cost) and the suite summary."""
    input:
        selections=PLAN.selections(),
        tables=rules.tables.output,
    output:
        report=f"{ROOT}/report.parquet",
        summary=f"{ROOT}/summary.parquet",
    log:
        f"{ROOT}/logs/report.log",
    shell:
        "{STAGE} report --config {CFG} --inputs {input.selections} --out {output.report} > {log} 2>&1"


rule html_report:
    """One self-contained HTML file: suite summary, speedups, fast_p, rounds, roofline, cost."""
    input:
        report=rules.report.output.report,
        summary=rules.report.output.summary,
    output:
        f"{ROOT}/report.html",
    log:
        f"{ROOT}/logs/html_report.log",
    shell:
        "{PY} -m kforge.cli report {input.report} --html {output} > {log} 2>&1"
