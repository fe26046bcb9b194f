"""Records exchanged between KForge stages.

Every artifact the pipeline writes is one of these pydantic models, serialised as canonical
JSON and stored by content (see ``kforge.store``). They are the contract between stages,
agents and platforms::

    Problem ──> GenerationRequest ──agent──> GenerationResult (candidate source)
                                               │
                         platform.build ──> BuildResult
                         verifier       ──> Verdict (reason codes, errors)
                         profiler       ──> Profile (timings, kernel table, roofline)
                                               │
    AnalysisRequest ──agent──> Recommendation ─┘──> next GenerationRequest (refine)

Agents (the embedded ``expert`` or an LLM through litellm) and platforms (``cpu``,
``triton``, ``cuda``, ``metal``) only ever see and return these records.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Policy = Literal["strict", "relaxed"]
Role = Literal["generate", "analyze"]

TOLERANCES: dict[str, float] = {"strict": 1e-4, "relaxed": 1e-2}


class Record(BaseModel):
    """Base for every stored record: unknown keys are errors, values are plain JSON."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- problems


class ProblemMeta(Record):
    """What the loader learned about one KernelBench-format problem."""

    name: str
    suite: str
    path: str
    source_digest: str
    preset: str
    sizes: dict[str, int] = Field(default_factory=dict)  # effective size constants
    category: str = "unknown"
    flops: float = 0.0
    min_bytes: float = 0.0
    degenerate: list[str] = Field(default_factory=list)
    error: str | None = None  # what went wrong (a failed load, or a cost count / reference run)
    # why the file does not load, on one line (``kforge.problems.ProblemError.brief``); None: it
    # loads. Such a problem is nobody's candidate: no agent is asked, its row is ``problem_error``
    load_error: str | None = None


# --------------------------------------------------------------------------- platforms


class PlatformInfo(Record):
    name: str
    language: str
    runnable: bool
    can_build: bool
    reason: str = ""
    missing: list[str] = Field(default_factory=list)
    interpreted: bool = False  # runs, but only for correctness (e.g. TRITON_INTERPRET=1)


class OneShotExample(Record):
    """A platform's one-shot example from ``refs/<platform>/``."""

    platform: str
    problem_source: str
    solution_source: str
    notes: str


class BuildResult(Record):
    ok: bool
    seconds: float
    log: str = ""
    artifact: str | None = None  # path of the built library or module, when any
    tool_versions: dict[str, str] = Field(default_factory=dict)


# --------------------------------------------------------------------------- verification


class CaseMargin(Record):
    """One verification case's error against what the policy allowed (the worst output's).

    ``margin`` = max error / allowed error: on the problem's own inputs (``native``, the
    other-sizes case) max(max_i |c_i - r_i| / (atol + rtol |r_i|), rel_err_norm / tol), on the
    stress distributions rel_err_norm / tol. At most 1 passes; 0.95 passed by a hair. None:
    not measurable (NaN or inf where the reference is finite)."""

    case: int
    dist: str
    other_sizes: bool = False
    output: int = 0
    margin: float | None = None
    # which limit the margin is closest to: "elementwise" or "norm"; "exact": a stress case
    # judged against the float64 reference because the fp32 one was itself off
    rule: str = "elementwise"
    max_abs_err: float | None = None
    rel_err_norm: float | None = None


class Verdict(Record):
    """Outcome of verifying one candidate against its reference."""

    ok: bool
    reason: str  # "ok" or a machine-readable reason code, e.g. "mismatch", "timeout"
    detail: str = ""
    policy: Policy
    atol: float
    rtol: float
    trials: int = 0
    max_abs_err: float | None = None
    rel_err_norm: float | None = None
    max_margin: float | None = None  # the worst CaseMargin.margin (None: none measured)
    margins: list[CaseMargin] = Field(default_factory=list)  # per case judged on values
    preset: str = ""  # the sizes verified at ("ci", "full", ...)
    compared_on: str = ""  # "host" (bytes to the parent) or "device" (CUDA IPC, gpu_compare.py)
    sandbox: str = "subprocess"
    interpreted: bool = False  # e.g. Triton under TRITON_INTERPRET=1
    device: str = "cpu"
    seconds: float = 0.0
    # wall seconds of the sandboxed jobs, seen by the parent: "reference" (0.0: from the cache),
    # "candidate" (the candidate's worker, with the on-device judge); the rest is static checks.
    # "reference.PHASE" / "candidate.PHASE": each worker's own account (verify.worker_phases)
    phase_s: dict[str, float] = Field(default_factory=dict)


# --------------------------------------------------------------------------- profiling


class KernelStat(Record):
    name: str
    calls: int
    total_us: float


# The kernel table's host row of a CUDA graph's replay (no device time; ``calls`` counts replays)
GRAPH_LAUNCH_ROW = "cudaGraphLaunch"


class Timing(Record):
    median_ms: float
    mean_ms: float
    cv: float
    reps: int
    min_ms: float
    # per-rep milliseconds in rep order: rep i of every callable timed together was taken in the
    # same round of the alternation, so samples pair by index (``kforge.verifier.paired``); empty
    # in profiles written before they were recorded
    samples: list[float] = Field(default_factory=list)


class RatioBound(Record):
    """A paired speedup over one baseline: the median of ``baseline_i / candidate_i`` over the
    reps timed back to back, with distribution-free order-statistic bounds on that median
    (``kforge.verifier.paired``): ``low`` and ``high`` are each a one-sided bound at
    ``confidence``, so [low, high] is a two-sided interval at ``2 * confidence - 1``."""

    baseline: Literal["eager", "compiled"]
    n: int  # the pairs the bound is over
    median: float
    low: float
    high: float
    confidence: float


class Profile(Record):
    """Timing and profile summary of one candidate; baselines when timed in the same run."""

    ok: bool
    reason: str = "ok"
    detail: str = ""
    device: str = "cpu"
    candidate: Timing | None = None
    eager: Timing | None = None
    compiled: Timing | None = None
    kernels: list[KernelStat] = Field(default_factory=list)
    flops: float = 0.0
    min_bytes: float = 0.0
    achieved_gflops: float = 0.0
    achieved_gbps: float = 0.0
    peak_gflops: float = 0.0
    peak_gbps: float = 0.0
    roofline_ms: float = 0.0
    extra: dict[str, Any] = Field(default_factory=dict)  # ncu metrics, clocks, threads


# --------------------------------------------------------------------------- agents


class Usage(Record):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0  # None: the model's price is unknown (never reported as 0)


class Transcript(Record):
    """One agent call, whatever the agent: same schema for the expert and for LLMs."""

    agent: str
    model: str
    role: Role
    messages: list[dict[str, Any]]
    response: str
    usage: Usage = Field(default_factory=Usage)
    latency_s: float = 0.0
    litellm_version: str | None = None
    request_digest: str = ""
    error: str | None = None


class Feedback(Record):
    """What went wrong last round, for a functional (repair) pass."""

    stage: Literal["generate", "compile", "verify", "profile"]
    reason: str
    detail: str


class Action(Record):
    kind: str  # e.g. "parallelize", "vectorize", "tile", "fuse", "block_size", "precision"
    params: dict[str, Any] = Field(default_factory=dict)
    expected_gain: float = 1.0
    rationale: str = ""


class Recommendation(Record):
    # "other": the analyst named something else; "unknown": no usable analysis
    bottleneck: Literal["memory", "compute", "latency", "launch", "other", "unknown"]
    evidence: dict[str, float] = Field(default_factory=dict)
    actions: list[Action] = Field(default_factory=list)
    summary: str = ""


class Attempt(Record):
    """One earlier round, as an agent is shown it in the attempt ledger."""

    round: int
    mode: str  # initial, repair, optimize, carry
    tried: str = ""  # what the round set out to do (the recommendation it followed, ...)
    verdict: str = ""  # the verifier's reason code ("ok" when it verified)
    candidate_ms: float | None = None
    best: bool = False  # the fastest verified round so far


class AgentContext(Record):
    """What an LLM agent is told beyond the problem: the target device (measured), the
    contract the verifier enforces, and in later rounds the timings and the attempt ledger."""

    device: dict[str, Any] = Field(default_factory=dict)  # measured peaks + device properties
    preset: str = ""  # the size preset the candidate is timed at
    timed_sizes: dict[str, int] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)  # candidate/eager/compile ms, ...
    signals: dict[str, Any] = Field(default_factory=dict)  # profiler signals of that candidate
    ledger: list[Attempt] = Field(default_factory=list)
    best_source: str | None = None  # the fastest verified kernel so far, when not the previous


class GenerationRequest(Record):
    problem_name: str
    problem_source: str
    platform: str
    example: OneShotExample
    policy: Policy
    round: int
    previous_source: str | None = None
    previous_plan: dict[str, Any] = Field(default_factory=dict)
    feedback: list[Feedback] = Field(default_factory=list)
    recommendation: Recommendation | None = None
    # max |err| / allowed over the previous round's verified cases (None: not verified / unknown);
    # a wide margin lets the embedded agent try one precision step down
    verified_margin: float | None = None
    # max |err| / allowed of the previous round's verdict when it failed (None: passed or
    # unknown): how far an accuracy repair must climb the precision ladder
    failed_margin: float | None = None
    transfer_source: str | None = None  # a verified kernel from another platform
    transfer_platform: str | None = None
    context: AgentContext | None = None  # LLM agents' context (None: the embedded agent)


class GenerationResult(Record):
    source: str | None  # the candidate module (defines ModelNew); None when extraction failed
    extraction: str = "ok"  # "ok", "no_code_block", "truncated", "multiple_blocks_joined", ...
    plan: dict[str, Any] = Field(default_factory=dict)  # agent-private state carried to refine
    transcript: Transcript


class AnalysisRequest(Record):
    problem_name: str
    platform: str
    policy: Policy
    candidate_source: str
    plan: dict[str, Any] = Field(default_factory=dict)
    profile: Profile
    timeline_png: str | None = None  # base64 picture of the profile, for models that see images
    problem_source: str | None = None  # the reference Model (LLM analysts read it)
    context: AgentContext | None = None


class AnalysisResult(Record):
    recommendation: Recommendation
    transcript: Transcript
