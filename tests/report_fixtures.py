"""A small synthetic run for the report, ship, query and HTML tests: real stage records in a real
store, real `select` (its timing comes from a pre-filled action cache, so nothing is timed),
real `tables` and `report`, in about a second and without torch timing or Snakemake."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kforge.config import parse_config
from kforge.schema import CaseMargin, ProblemMeta, Profile, Timing, Transcript, Usage, Verdict
from kforge.stages.context import StageContext, write_record
from kforge.stages.records import (
    AnalysisRecord,
    CandidateRecord,
    CompileRecord,
    ProfileRecord,
    VerifyRecord,
)
from kforge.stages.report import run_report, run_tables
from kforge.stages.select import run_select
from kforge.store import Store

REPO = Path(__file__).resolve().parents[1]
STARTER = REPO / "problems" / "starter"

KERNEL = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Synthetic candidate {tag}."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)
'''


@dataclass
class Cell:
    problem: str
    platform: str = "cpu"
    ok: bool = True  # the candidate of every round verifies
    cand_ms: float = 1.0
    eager_ms: float = 2.0
    compile_ms: float = 2.5
    cv: float = 0.01
    nondeterministic: bool = False
    roofline: bool = False
    interpreted: bool = False
    rounds: int = 2
    cost: float = 0.01
    margin: float | None = None  # the verdicts' max_margin (None: no margins recorded)
    precision: str | None = None  # recorded in the plan as the dominant kernel's knob
    round_baselines: bool = False  # the rounds' profiles time eager and torch.compile too
    cached_select: bool = True  # select's own timing pre-cached (False: select must not time)
    samples: bool = True  # the timings carry per-rep samples (False: a profile from before they did)


CELLS = [
    Cell("softmax_rows"),  # 2.0x: shipped
    Cell("logsoftmax_rows", cand_ms=1.0, eager_ms=1.01, compile_ms=1.5),  # inside the 2% band: no_gain
    Cell("gemm_bias_relu", cand_ms=2.0, eager_ms=1.26, compile_ms=1.3),  # 0.63x: slower, no_gain
    Cell("reduce_max_rows", eager_ms=1.2, cv=0.3),  # 1.2x but noisy (paired 95% low 0.91x): no_gain
    Cell("layernorm_rows", ok=False),  # failed
    Cell("reduce_mean_rows", cand_ms=0.001, roofline=True),  # beats the roofline: roofline_flagged
    Cell("elementwise_swish_bias", nondeterministic=True),  # 2x, but the reference is nondeterministic
    Cell("gemm_gelu_scale", eager_ms=4.0, compile_ms=3.0),  # 3.0x: shipped
    Cell("softmax_rows", platform="triton", interpreted=True),  # correct, never timed
]


def config(root: Path, optimization: int = 1) -> StageContext:
    cfg = parse_config({
        "store": str(root / "artifacts"), "policy": "strict",
        "agents": {"expert": {"kind": "expert"}},
        "suites": {"starter": {"path": str(STARTER), "preset": "ci"}},
        "run": {"agents": ["expert"], "platforms": ["cpu"], "suites": ["starter"]},
        "rounds": {"functional": 0, "optimization": optimization},
    })
    return StageContext(config=cfg, store=Store(cfg.store))


REPS = 20
# per rep: a drift every callable of the rep shares (the host's load), and the ratio's own noise,
# a fixed shuffle of +-1.8 in steps of 0.2 with a double 0, so the median paired ratio is exactly
# the ratio of the cell's milliseconds and the 95% lower bound (the 6th of 20) is ratio x (1 - 0.8 cv)
DRIFT = [(i - 9.5) / 9.5 for i in range(REPS)]
SPREAD = [0.0, 0.0, *(j / 5 for j in range(-9, 10) if j)]
NOISE = [SPREAD[(7 * i) % REPS] for i in range(REPS)]


def _timing(ms: float, cv: float, *, baseline: bool = False, samples: bool = True) -> Timing:
    reps = [ms * (1 + cv * d) * (1 + cv * e if baseline else 1.0) for d, e in zip(DRIFT, NOISE, strict=True)]
    return Timing(median_ms=ms, mean_ms=ms, cv=cv, reps=REPS, min_ms=ms * 0.95, samples=reps if samples else [])


def _profile(cell: Cell, *, baselines: bool) -> Profile:
    def base(ms: float) -> Timing | None:
        return _timing(ms, cell.cv, baseline=True, samples=cell.samples) if baselines else None

    return Profile(
        ok=True, candidate=_timing(cell.cand_ms, cell.cv, samples=cell.samples),
        eager=base(cell.eager_ms), compiled=base(cell.compile_ms),
        flops=1e6, min_bytes=4e6, roofline_ms=0.05, achieved_gflops=1.0, peak_gflops=100.0,
        extra={"beats_roofline": cell.roofline},
    )


def _plan(cell: Cell) -> dict[str, object]:
    if cell.precision is None:
        return {}
    return {"dominant": "k0", "knobs": {"k0": {"BLOCK_M": 64, "precision": cell.precision}, "k1": {"BLOCK": 256}}}


def _margins(cell: Cell) -> dict[str, object]:
    if cell.margin is None:
        return {}
    cases = [CaseMargin(case=0, dist="native", margin=cell.margin, max_abs_err=2e-6, rel_err_norm=1e-7),
             CaseMargin(case=1, dist="signed", margin=cell.margin / 2, rule="norm")]
    return {"margins": cases, "max_margin": cell.margin}


def write_cell(ctx: StageContext, cell: Cell) -> Path:
    """Round records for one cell, the problem record, and the select action already cached."""
    store, root = ctx.store, ctx.root
    source_text = (STARTER / f"{cell.problem}.py").read_bytes()
    problem_src = store.put_bytes(source_text)
    meta = ProblemMeta(name=cell.problem, suite="starter", path=str(STARTER / f"{cell.problem}.py"),
                       source_digest=problem_src, preset="ci",
                       degenerate=["nondeterministic"] if cell.nondeterministic else [])
    problem_record = root / "problems" / "starter" / f"{cell.problem}.json"
    problem_digest = write_record(problem_record, meta, store)
    example_digest = store.put_json({"platform": cell.platform, "example": "synthetic"})
    run = root / "runs" / "expert" / cell.platform / "starter" / cell.problem
    parent = None
    dirs = []
    for r in range(cell.rounds):
        d = run / f"r{r}"
        kernel = KERNEL.format(tag=f"{cell.platform}/{cell.problem}/r{r}")
        (d).mkdir(parents=True, exist_ok=True)
        (d / "kernel.py").write_text(kernel)
        src = store.put_text(kernel)
        transcript = Transcript(agent="expert", model="kforge/expert-v1", role="generate",
                                messages=[{"role": "user", "content": "write it"}], response=kernel,
                                usage=Usage(prompt_tokens=100, completion_tokens=50, cost_usd=cell.cost))
        cand = CandidateRecord(
            agent="expert", model="kforge/expert-v1", platform=cell.platform, suite="starter",
            problem=cell.problem, round=r, mode="initial" if r == 0 else "optimize", source=src, extraction="ok",
            plan=store.put_json(_plan(cell)), transcript=store.put_json(transcript), parent=parent,
            used={"problem": problem_digest, "example": example_digest}, prompt_tokens=100,
            completion_tokens=50, cost_usd=cell.cost, seconds=0.5,
        )
        parent = write_record(d / "candidate.json", cand, store)
        write_record(d / "compile.json", CompileRecord(platform=cell.platform, source=src, ok=True, reason="ok",
                                                       log=None, seconds=1.0, tool_versions={"g++": "12"}), store)
        verdict = Verdict(ok=cell.ok, reason="ok" if cell.ok else "mismatch", policy="strict", atol=1e-4,
                          rtol=1e-4, max_abs_err=2e-6 if cell.ok else 0.5, rel_err_norm=1e-7,
                          interpreted=cell.interpreted, seconds=2.0, **_margins(cell))
        write_record(d / "verify.json", VerifyRecord(platform=cell.platform, problem_source=problem_src,
                                                     preset="ci", source=src, verdict=verdict), store)
        timed = cell.ok and not cell.interpreted
        # the later round is the faster one, so speedup per round has something to show
        prof = _profile(Cell(**{**cell.__dict__, "cand_ms": cell.cand_ms * (1.5 - 0.5 * r)}),
                        baselines=cell.round_baselines)
        write_record(d / "profile.json", ProfileRecord(platform=cell.platform, problem_source=problem_src, source=src,
                                                       profile=prof if timed else None,
                                                       skipped=None if timed else "not verified"), store)
        write_record(d / "analysis.json", AnalysisRecord(agent="expert", platform=cell.platform, source=src,
                                                         skipped="synthetic"), store)
        dirs.append(d)
    # select's timing, pre-cached under the key select computes
    last = dirs[-1]
    suite = ctx.config.suites["starter"]
    key = ctx.action_key("select", platform=cell.platform, source=store.put_text((last / "kernel.py").read_text()),
                         problem=problem_src, preset=suite.preset, sizes=suite.sizes,
                         settings=ctx.config.profile.model_dump(mode="json"))
    if cell.cached_select:
        timing = store.put_json(_profile(cell, baselines=True))
        store.action_put(key, {"profile": timing, "seconds": 3.0}, [timing])
    run_select(ctx, round_dirs=dirs, out=run / "best.json", problem_record=problem_record)
    return run / "best.json"


def build_run(root: Path, cells: list[Cell] | None = None) -> StageContext:
    """Write every cell, then the tables, the report and the summary (as the pipeline does)."""
    ctx = config(root)
    selections = [write_cell(ctx, c) for c in (CELLS if cells is None else cells)]
    records = sorted(p for p in (ctx.root / "runs").glob("*/*/*/*/r[0-9]*/*.json"))
    run_tables(ctx, records=records, out_dir=ctx.root / "tables")
    run_report(ctx, selections=selections, out=ctx.root / "report.parquet")
    return ctx
