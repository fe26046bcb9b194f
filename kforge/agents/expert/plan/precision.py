"""The precision ladder of a GEMM's products, defined once: one :class:`Step` row per step.

    step     operands                                   cost  error   strict  H200 peak
    bf16     rounded to bf16, fp32 accumulate              1  9.8e-3          790 TFLOP/s
    fp16     rounded to fp16 (3 more mantissa bits)        1  1.2e-3          790
    bf16x2   A split hi/lo, B once: hi*hi + lo*hi          2  6.7e-3          395
    fp16x2   the same in fp16 (lo scaled by 2^11)          2  8.4e-4          395
    tf32     rounded to TF32 (10-bit mantissa)             2  4.3e-3          400
    bf16x3   hi/lo split: hi*hi + hi*lo + lo*hi            3  1.6e-4  yes     263
    fp16x3   the same in fp16 (lo scaled by 2^11)          3  2.4e-5  yes     263
    tf32x3   error-compensated TF32                        6  2.3e-5  yes     133
    ieee     fp32 x fp32, exact FMA (no tensor cores)     16  9.5e-7  yes      60

The ladder is ordered by cost (tensor-core products at the bf16 rate), then by accuracy.
``error`` is each step's max error on one large GEMM: the bf16, tf32 and ieee steps measured
on the H200 (``benchmarks/results/gemm_ladder_h200.md``: a 1024 x 8192 x 8192 GEMM +
epilogue); the fp16 steps scaled from their bf16 / tf32 counterparts by a CPU simulation of a
256 x 8192 x 8192 ``nn.Linear`` GEMM (``benchmarks/results/half_split_error_cpu.md``: relative
error norm fp16 / bf16 0.125 for one and two products; fp16x3, its lo parts stored times 2^11,
has tf32x3's norm and 1.06x its worst element, so a hair above it and tf32x3 stays the step
after it). Strict admits a step whose designed error is below the strict tolerance (1e-4);
whether a problem's output meets it is the verifier's call. An accuracy repair predicts each
step's margin as (failed margin) x (its error / the failed step's) and takes the cheapest step
predicted at or below :data:`STEP_UP_TARGET` (:func:`step_up`); a pass with room to spare
tries the next cheaper cost (:func:`step_down`).

Round 0 starts at :data:`ROUND0`: fp16 where bf16 was (the same tensor-core rate and bytes,
~8x less error: on the H100 17 of 41 level2 problems missed the relaxed tolerance with bf16
operands at margins of 1.03-5.3, 15 on the H200 before), fp16x3 where bf16x3 was. A backend
renders the steps it lists (``Backend.steps``); the ladder of a backend and a policy is the
rows both allow.
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.agents.expert.errors import PlanError


@dataclass(frozen=True)
class Step:
    name: str
    cost: int  # tensor-core products at the bf16 rate
    error: float  # max |error| of one large GEMM (see the module docstring)
    strict: bool  # allowed under the strict policy
    peak_gflops: float  # the H200's dense rate at this step
    parts: str | None = None  # the 16-bit operand type ("bf16" | "fp16"); None: fp32 operands
    split: tuple[bool, bool] = (False, False)  # (A, B) split into hi and lo parts

    @property
    def scaled_lo(self) -> bool:
        """An fp16 split: lo parts stored times 2^11, their products in an accumulator of their own."""
        return self.parts == "fp16" and any(self.split)


LADDER: tuple[Step, ...] = (
    Step("bf16", 1, 9.8e-3, False, 790_000.0, "bf16"),
    Step("fp16", 1, 1.2e-3, False, 790_000.0, "fp16"),
    Step("bf16x2", 2, 6.7e-3, False, 790_000.0 / 2, "bf16", (True, False)),
    Step("fp16x2", 2, 8.4e-4, False, 790_000.0 / 2, "fp16", (True, False)),
    Step("tf32", 2, 4.3e-3, False, 400_000.0),
    Step("bf16x3", 3, 1.6e-4, True, 790_000.0 / 3, "bf16", (True, True)),
    Step("fp16x3", 3, 2.4e-5, True, 790_000.0 / 3, "fp16", (True, True)),
    Step("tf32x3", 6, 2.3e-5, True, 400_000.0 / 3),
    Step("ieee", 16, 9.5e-7, True, 60_000.0),
)
STEPS: dict[str, Step] = {s.name: s for s in LADDER}
ROUND0 = {"relaxed": "fp16", "strict": "fp16x3"}
POLICIES = ("strict", "relaxed")
# An fp16 split stores its lo parts times 2^11: exact, and never past fp16's range since
# |x - hi| <= |hi| 2^-11, so a weight-sized lo (~5e-6) stays a normal fp16 number instead of a
# subnormal one with a few bits (unscaled, fp16x3's error norm was 2.7e-6, scaled 2.8e-7).
FP16_LO_SCALE = 2048
STEP_UP_TARGET = 0.7  # an accuracy repair takes the cheapest step predicted at or below this margin
STEP_DOWN_MARGIN = 0.02  # max |err| / allowed below this on every case: a cheaper step is tried


def step(name: str) -> Step:
    try:
        return STEPS[name]
    except KeyError:
        raise PlanError(f"unknown precision step {name!r}: one of {', '.join(STEPS)}") from None


def allowed(policy: str, steps: tuple[str, ...] | None = None) -> tuple[Step, ...]:
    """The ladder's steps the policy allows (of ``steps``, a backend's, when given)."""
    if policy not in POLICIES:
        raise PlanError(f"unknown precision policy {policy!r}: 'strict' or 'relaxed'")
    return tuple(s for s in LADDER if (s.strict or policy == "relaxed") and (steps is None or s.name in steps))


def first_step(policy: str, steps: tuple[str, ...] | None = None) -> Step:
    """Round 0's step: :data:`ROUND0` where the backend renders it, else its cheapest allowed."""
    ladder = allowed(policy, steps)
    if not ladder:
        raise PlanError(f"the backend renders no GEMM step the {policy} policy allows")
    preferred = STEPS[ROUND0[policy]]
    return preferred if preferred in ladder else ladder[0]


def check_allowed(name: str, policy: str, steps: tuple[str, ...] | None = None) -> Step:
    """``name``'s row, or a PlanError saying which steps the policy (and backend) allow."""
    ladder = allowed(policy, steps)
    if step(name) not in ladder:
        raise PlanError(f"precision {name!r} is not allowed under the {policy} policy "
                        f"(allowed: {', '.join(s.name for s in ladder)})")
    return STEPS[name]


def step_up(precision: str, policy: str, margin: float | None = None, overflow: bool = False,
            steps: tuple[str, ...] | None = None) -> str | None:
    """A more accurate precision the policy allows (None at the top): the next one, or, given
    the failed verdict's ``margin`` (max |err| / allowed > 1), the cheapest one whose predicted
    margin (``margin`` scaled by the steps' errors) is at most :data:`STEP_UP_TARGET`; the most
    accurate allowed step when none is predicted to pass. ``overflow``: the step's outputs were
    NaN or inf where the reference's are finite; the fp16 steps share that range and are skipped."""
    if precision not in STEPS:
        return None
    here = STEPS[precision]
    above = [s for s in allowed(policy, steps) if LADDER.index(s) > LADDER.index(here)]
    if overflow:  # NaN/inf where the reference is finite: fp16's range (+-65504), not its bits
        above = [s for s in above if s.parts != "fp16"]
    else:
        above = [s for s in above if s.error < here.error]
    # of the steps of one cost, only the most accurate (fp16x3 before bf16x3)
    above = [s for s in above if s.error == min(t.error for t in above if t.cost == s.cost)]
    if not above:
        return None
    if margin is None or not margin > 1.0:
        return above[0].name
    for s in above:
        if margin * s.error / here.error <= STEP_UP_TARGET:
            return s.name
    return above[-1].name


def step_down(precision: str, policy: str, margin: float | None, steps: tuple[str, ...] | None = None) -> str | None:
    """The next cheaper precision the policy allows, when the last pass had room to spare
    (``margin`` = max |err| / allowed over the verified cases, below :data:`STEP_DOWN_MARGIN`)."""
    if margin is None or not margin < STEP_DOWN_MARGIN or precision not in STEPS:
        return None
    below = [s for s in allowed(policy, steps) if s.cost < STEPS[precision].cost]
    if not below:
        return None
    cost = max(s.cost for s in below)  # the next cheaper cost, its most accurate step
    return min((s for s in below if s.cost == cost), key=lambda s: s.error).name
