def profile_threads(wildcards):
    """A timing job's share of the cores. Its timed window holds the host's lease (and a GPU's)
    exclusively (kforge/verifier/device_lease.py), so no other job runs beside it then, and it
    need not own the cores for its whole life: a GPU profile takes a quarter (at most four at
    once, each holding its reference, torch.compile's baseline and a CUDA context in GPU memory
    while it waits), a CPU profile one."""
    if wildcards.platform in ("triton", "cuda"):
        return max(1, workflow.cores // 4)
    return 1


rule peaks:
    """The device's copy bandwidth and matmul rates, measured once per host with the machine
    to itself: the roofline check of every profile rests on them."""
    output:
        f"{ROOT}/host/peaks-{{platform}}.json",
    threads: workflow.cores
    # first, on the machine alone: it needs every core, and behind the stream of other jobs
    # it waited until the last of them had drained (the README's main job: 250 s)
    priority: 100
    resources:
        gpu=lambda w: 1 if w.platform in ("triton", "cuda") else 0,
    log:
        f"{ROOT}/logs/peaks-{{platform}}.log",
    shell:
        "{STAGE} peaks --config {CFG} --platform {wildcards.platform} --out {output} > {log} 2>&1"


rule warm:
    """torch.compile of a suite's references, compiled while other jobs share the machine: the
    timing jobs that own it load the compiled baselines from these caches
    (kforge/verifier/compile_cache.py). One worker compiles the whole suite: inductor's start in
    a fresh process was ~8 s of each problem's ~9 s."""
    input:
        problems=lambda w: [f"{ROOT}/problems/{w.suite}/{p}.json" for p in PLAN.problems[w.suite]],
    output:
        f"{ROOT}/warm/{{platform}}/{{suite}}.json",
    params:
        code=PLAN.code["warm"],
        settings=PLAN.settings_digest("profile", "policy"),
        suite=lambda w: PLAN.suite_digest(w.suite),
    threads: 1
    log:
        f"{ROOT}/logs/warm-{{platform}}-{{suite}}.log",
    shell:
        "{STAGE} warm --config {CFG} --platform {wildcards.platform} --suite {wildcards.suite} "
        "--inputs {input.problems} --out {output} > {log} 2>&1"


rule profile:
    """Time and profile a verified candidate: evidence for the analysis agent (the report's
    numbers come from `select`), except in a run without optimization rounds: there it times
    eager and torch.compile too and select reports its numbers (kforge/stages/profile.py).
    Its timed window holds the host's lease and the device's exclusively
    (kforge/verifier/device_lease.py): other jobs share the machine while a profile starts and
    prepares, never while it times, so a few profiles run at once."""
    input:
        kernel=f"{RUN}/r{{r}}/kernel.py",
        verified=f"{RUN}/r{{r}}/verify.json",
        peaks=f"{ROOT}/host/peaks-{{platform}}.json",
        warm=lambda w: [f"{ROOT}/warm/{w.platform}/{w.suite}.json"] if PLAN.profile_baselines else [],
    output:
        f"{RUN}/r{{r}}/profile.json",
    params:
        code=PLAN.code["profile"],
        settings=PLAN.settings_digest("profile"),
        suite=lambda w: PLAN.suite_digest(w.suite),
        baselines=PLAN.profile_baselines,
        warm=lambda w, input: f"--warm-record {input.warm[0]}" if input.warm else "",
    threads: profile_threads
    log:
        f"{RUN}/r{{r}}/profile.log",
    wildcard_constraints:
        r=r"[0-9]+",
    shell:
        "{STAGE} profile --config {CFG} --platform {wildcards.platform} --suite {wildcards.suite} "
        "--problem {wildcards.problem} --kernel {input.kernel} --verify-record {input.verified} "
        "{params.warm} --out {output} > {log} 2>&1"
