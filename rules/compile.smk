rule compile:
    """Build the kernels a candidate embeds; errors become feedback for the next round."""
    input:
        kernel=f"{RUN}/r{{r}}/kernel.py",
    output:
        f"{RUN}/r{{r}}/compile.json",
    params:
        code=PLAN.code["compile"],
    log:
        f"{RUN}/r{{r}}/compile.log",
    wildcard_constraints:
        r=r"[0-9]+",
    shell:
        "{STAGE} compile --config {CFG} --platform {wildcards.platform} --kernel {input.kernel} "
        "--out {output} > {log} 2>&1"
