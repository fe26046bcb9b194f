"""Machine-readable reason codes for ``Verdict.reason`` and ``Profile.reason``.

One code per way a candidate can fail; the generation agent reads the code, the human reads
``detail``. Codes are strings on the wire (records stay plain JSON)::

    ok
    ├── static (no execution)    syntax_error, no_model_new, calls_reference_op, torch_fallback,
    │                            wraps_reference, harness_tampering, precision_below_policy,
    │                            forbidden_include, spawns_work, foreign_compute
    ├── process (sandbox)        import_error, timeout, crashed, oom, process_limit,
    │                            output_flood, device_error, no_device, harness_error,
    │                            problem_error (the problem itself does not load or run)
    ├── outputs (parent compares) output_mismatch, shape_mismatch, dtype_mismatch, nonfinite,
    │                            aliases_input, mutates_input, rigged_output_object,
    │                            caches_outputs, shape_specialized, wrong_device
    ├── behaviour (worker probes) no_kernel_launched, async_work_left, beats_roofline,
    │                            global_state_tampering (module hooks, dispatch / function
    │                            modes, backend flags, thread counts or env changed)
    ├── timing (profiling.py,     stale_output: a timed call's output disagrees with the
    │   handshake.py)            reference for its inputs (the timing measured no real work);
    │                            timing_inconsistent: the worker's claimed times disagree with
    │                            the parent's clock or CPU-time reading
    └── sanitizer (opt-in, CUDA) sanitizer_memcheck, sanitizer_racecheck: compute-sanitizer
                                 found out-of-bounds or misaligned accesses (memcheck) or a
                                 shared-memory hazard (racecheck) in a run whose outputs passed;
                                 ``detail`` lists the sanitizer's findings (``sanitizer.py``)
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    OK = "ok"
    # static
    SYNTAX_ERROR = "syntax_error"
    NO_MODEL_NEW = "no_model_new"
    CALLS_REFERENCE_OP = "calls_reference_op"
    TORCH_FALLBACK = "torch_fallback"
    WRAPS_REFERENCE = "wraps_reference"
    HARNESS_TAMPERING = "harness_tampering"
    PRECISION_BELOW_POLICY = "precision_below_policy"
    FORBIDDEN_INCLUDE = "forbidden_include"
    SPAWNS_WORK = "spawns_work"
    FOREIGN_COMPUTE = "foreign_compute"  # another numerical library (numpy, scipy, ...) does the work
    # process
    IMPORT_ERROR = "import_error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    OOM = "oom"
    PROCESS_LIMIT = "process_limit"
    OUTPUT_FLOOD = "output_flood"
    DEVICE_ERROR = "device_error"
    NO_DEVICE = "no_device"
    HARNESS_ERROR = "harness_error"  # our fault (reference failed): not the candidate's
    PROBLEM_ERROR = "problem_error"  # the problem file itself does not load or run: nobody's candidate
    # outputs
    OUTPUT_MISMATCH = "output_mismatch"
    SHAPE_MISMATCH = "shape_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    NONFINITE = "nonfinite"
    ALIASES_INPUT = "aliases_input"
    MUTATES_INPUT = "mutates_input"
    RIGGED_OUTPUT_OBJECT = "rigged_output_object"
    CACHES_OUTPUTS = "caches_outputs"
    SHAPE_SPECIALIZED = "shape_specialized"
    WRONG_DEVICE = "wrong_device"
    # behaviour
    NO_KERNEL_LAUNCHED = "no_kernel_launched"
    ASYNC_WORK_LEFT = "async_work_left"
    BEATS_ROOFLINE = "beats_roofline"
    GLOBAL_STATE_TAMPERING = "global_state_tampering"  # hooks, modes, backend flags, threads, env changed
    # timing (profiling.py, handshake.py)
    STALE_OUTPUT = "stale_output"
    TIMING_INCONSISTENT = "timing_inconsistent"
    # sanitizer (verify.sanitizer in the config; sanitizer.py)
    SANITIZER_MEMCHECK = "sanitizer_memcheck"
    SANITIZER_RACECHECK = "sanitizer_racecheck"


# Codes that mean "the harness or the problem failed", not the candidate: callers may retry.
NOT_CANDIDATE_FAULT: frozenset[Reason] = frozenset({Reason.HARNESS_ERROR, Reason.NO_DEVICE, Reason.PROBLEM_ERROR})
