# KForge: the whole loop as a Snakemake workflow. Stages live in rules/<stage>.smk, logic in
# the kforge package. Run: snakemake --cores 4 artifacts/report.parquet
include: "rules/common.smk"
include: "rules/problem.smk"
include: "rules/example.smk"
include: "rules/generate.smk"
include: "rules/compile.smk"
include: "rules/verify.smk"
include: "rules/profile.smk"
include: "rules/analyze.smk"
include: "rules/refine.smk"
include: "rules/report.smk"

# Aggregation over finished records (seconds, no device): under a cluster executor these run on
# the submitting host instead of queueing as jobs (profiles/slurm); locally nothing changes.
localrules: tables, report, html_report


rule all:
    default_target: True
    input:
        f"{ROOT}/report.parquet",
        f"{ROOT}/report.html",
