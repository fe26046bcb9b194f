"""The sandboxed worker: ``python -m kforge.verifier.worker_main`` (one process per job).

Reads its job (JSON) from stdin, answers in frames on the result pipe (``protocol.py``) and
ends with ``os._exit`` right after the final frame, so no ``atexit`` hook or finaliser of the
candidate runs after the answer. Modes::

    reference        the problem's Model on every case: outputs, input digests, aten ops, flags;
                     and its answers for the repeat phase's emitted calls (``repeats.py``)
    candidate        ModelNew on the same cases: outputs (raw bytes), probes around every call,
                     then the repeat phase
    timed_reference  a timing's trusted side: eager and torch.compile, FLOPs and bytes, the
                     reference's answers for the checked calls (``timed_worker.py``)
    timed_candidate  a timing's candidate side: ModelNew, checked outputs to the judge
    compile_cache    torch.compile of the reference alone, its caches kept (``compile_cache.py``)

The parent compares; the worker only reports facts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

NONCE: bytes = b""
RESULT_FD = -1


def process_age_s() -> float | None:
    """Seconds since this process started (``/proc``; None elsewhere)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class Phases:
    """Where a job's seconds went, phase by phase: ``mark(name)`` closes the phase that ran
    since the previous mark; ``startup`` is the process's start (interpreter, torch, CUDA
    libraries) up to the first phase."""

    def __init__(self) -> None:
        import time

        self._clock = time.perf_counter
        self._last = self._clock()
        age = process_age_s()
        self.seconds: dict[str, float] = {}
        if age is not None:
            self.seconds["startup"] = round(age, 3)

    def mark(self, name: str) -> None:
        now = self._clock()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._last, 3)
        self._last = now

    def mark_cases(self, done: int) -> None:
        """Close the case that just ran, the ``done``-th: the first (which builds the models and
        runs under the profiler) is ``first_case``, the others add up in ``cases``."""
        if done:
            self.mark("first_case" if done == 1 else "cases")


def open_channel(fd: int, nonce: bytes) -> tuple[Any, Any, Any]:
    """``send``, ``finish`` and ``fail`` bound to the result pipe, made before any candidate code
    runs. They reach each other and the frame encoder through closure cells, not module
    globals: a candidate that rebinds ``worker.send`` or ``protocol.encode_frame`` changes
    nothing they call (and ``Integrity`` sees the rebinding)."""
    from kforge.verifier.protocol import encode_frame

    write, close, exit_, fmt = os.write, os.close, os._exit, traceback.format_exception
    is_oom, is_device_error = _is_oom, _is_device_error

    def send(header: dict[str, Any], blobs: list[bytes] | None = None) -> None:
        data = memoryview(encode_frame(nonce, header, blobs))
        while data:
            data = data[write(fd, data):]

    def finish(header: dict[str, Any] | None = None) -> None:
        send(dict(header or {}, kind="done"))
        close(fd)
        sys.stdout.flush()
        sys.stderr.flush()
        exit_(0)

    def fail(kind: str, exc: BaseException | str, **extra: Any) -> None:
        text = exc if isinstance(exc, str) else "".join(fmt(exc)[-6:])
        if not isinstance(exc, str) and is_oom(exc):
            kind = "oom"
        if not isinstance(exc, str) and is_device_error(exc):
            kind = "device_error"
        finish({"error": kind, "message": text[-4000:], **extra})

    return send, finish, fail


def _not_open(*_: Any, **__: Any) -> None:
    raise RuntimeError("the result channel is not open (main() opens it)")


send: Callable[..., None] = _not_open  # main() rebinds all three to the channel's closures
finish: Callable[..., None] = _not_open
fail: Callable[..., None] = _not_open


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text


def _is_device_error(exc: BaseException) -> bool:
    text = str(exc)
    return "CUDA error" in text or "illegal memory access" in text or "device-side assert" in text


def load_module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build_models(problem: Any, model_new_cls: type | None, seed: int, device: str) -> tuple[Any, Any]:
    """Model and ModelNew from the same seed; ModelNew takes Model's weights when names match.

    Both stay in the mode their constructors leave them in (training mode unless the problem
    says otherwise), as KernelBench runs them: BatchNorm uses batch statistics, and a Dropout
    with p > 0 makes the reference nondeterministic (flagged when the problem is loaded)."""
    import torch

    torch.manual_seed(seed)
    ref = problem.Model(*problem.get_init_inputs()).to(device)
    new = None
    if model_new_cls is not None:
        torch.manual_seed(seed)
        new = model_new_cls(*problem.get_init_inputs()).to(device)
        ref_state, new_state = ref.state_dict(), new.state_dict()
        if ref_state.keys() == new_state.keys() and all(
            ref_state[k].shape == new_state[k].shape for k in ref_state
        ):
            new.load_state_dict(ref_state)
    return ref, new


def warm_thread_pool() -> None:
    """Start torch's intra-op threads before any candidate code, so they are not 'its' threads."""
    import torch
    import torch._dynamo  # noqa: F401 - it rewraps torch.manual_seed on import: do it before snapshots
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(1 << 18)
    with profile(activities=[ProfilerActivity.CPU]):
        (a * a).sum()


def poison(nbytes: int, device: str) -> None:
    """Fill and free a block so a reused uninitialised allocation shows NaN, not an answer."""
    import torch

    n = max(1, nbytes // 4)
    block = torch.full((n,), float("nan"), device=device)
    del block


def _reference_case(job: dict[str, Any], case: Any, cache: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kforge.verifier.inputs import (
        combine,
        input_digests,
        load_case_problem,
        make_inputs,
        tensors_in,
    )
    from kforge.verifier.probes import encode_tensor, precision_flags, profile_events

    device = job["device"]
    sizes = case.sizes if case.sizes is not None else job.get("sizes")
    key = json.dumps(sizes, sort_keys=True)
    if key not in cache:
        p = load_case_problem(Path(job["problem_path"]), job["preset"], sizes)
        cache[key] = (p, build_models(p, None, job["model_seed"], device)[0])
    problem, model = cache[key]
    inputs = make_inputs(problem, case, device, draw_on_device=bool(job.get("draw_on_device")))
    each = input_digests(inputs)
    before = combine(each)
    ops: list[str] = []
    same = True
    with torch.no_grad():
        if case.index == 0:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                out = model(*inputs)
            ops = sorted(set(profile_events(prof)[0]))
            again = model(*inputs)
            same = all(torch.equal(a, b) for a, b in zip(tensors_in(out), tensors_in(again), strict=True))
        else:
            out = model(*inputs)
    tensors = list(tensors_in(out))
    metas, blobs = [], []
    for t in tensors:
        if job.get("device_compare"):  # the judge recomputes these on the device (gpu_compare.py)
            metas.append({"shape": list(t.shape), "dtype": str(t.dtype), "device": str(t.device)})
            continue
        meta, blob = encode_tensor(t)
        metas.append(meta)
        blobs.append(blob)
    header = {"kind": "case", "index": case.index, "dist": case.dist, "sizes": sizes, "outputs": metas,
              "digest": before, "input_digests": each, "ops": ops, "deterministic": same, "flags": precision_flags()}
    low = low_precision(tensors)
    if (case.dist != "native" or job.get("whole_model") or low) and not job.get("device_compare"):
        exact = exact_outputs(model, inputs, len(tensors))
        if exact is not None:
            header["as_reference"] = bool(job.get("whole_model")) or low  # correctness.against_exact
            header["exact"] = []
            for t in exact:
                meta, blob = encode_tensor(t)
                header["exact"].append(meta)
                blobs.append(blob)
    return header, blobs


def low_precision(tensors: list[Any]) -> bool:
    """A bf16 / f16 answer: the reference rounds every op's result to 8 or 11 bits, so it can be
    further from the float64 answer than the tolerance (a bf16 attention at inputs of scale 4:
    0.04 off, a kernel computing in f32 0.01); such a problem is judged against the float64
    answer with the reference's own error as the yardstick (rule ``as_reference``)."""
    import torch

    return any(isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16) for t in tensors)


def exact_outputs(model: Any, inputs: list[Any], n: int) -> list[Any] | None:
    """The reference in float64 (a copy of the model and of the floating inputs) for a stress
    case, and for the strict policy's checked timing (the oracle, ``timed_worker.py``):
    heavy-tailed or scaled inputs, or sums that cancel, push the fp32 reference itself past the strict
    tolerance (KernelBench's FrobeniusNorm: torch.norm's fp32 sum is 1.2e-4 off on a
    heavy-tailed input), so a candidate within tolerance of this one is right too. None when
    the model does not run in float64."""
    import copy

    import torch

    from kforge.verifier.inputs import tensors_in

    try:
        model64 = copy.deepcopy(model).double()
        args = [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
        with torch.no_grad():
            out = list(tensors_in(model64(*args)))
    except Exception:  # noqa: BLE001 - an op without a float64 kernel: the fp32 reference alone
        return None
    return out if len(out) == n else None


def run_reference(job: dict[str, Any]) -> None:
    import torch

    from kforge.verifier.inputs import Case, alternative_sizes, load_case_problem

    # The ground truth is the fp32 answer. PyTorch runs cuDNN convolutions in TF32 by default
    # (~1e-3 relative error on a GPU, ten times the strict tolerance): an exact fp32 candidate
    # would fail against it. Candidates are judged against what they may not switch on.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    phases = Phases()
    cache: dict[str, Any] = {}
    path = Path(job["problem_path"])
    for i, raw in enumerate(job["cases"]):
        phases.mark_cases(i)
        if raw.get("sizes") == "auto":
            try:
                base = load_case_problem(path, job["preset"], job.get("sizes")).sizes()
            except Exception as exc:  # noqa: BLE001
                send({"kind": "case", "index": raw["index"], "error": f"{type(exc).__name__}: {exc}"})
                continue
            options = [dict(raw, sizes=alt) for alt in alternative_sizes(base)]
        else:
            options = [raw]
        error = "no other sizes to try"
        for option in options:
            try:
                header, blobs = _reference_case(job, Case.from_json(option), cache)
                send(header, blobs)
                break
            except Exception as exc:  # noqa: BLE001 - reported to the parent as a harness error
                error = f"{type(exc).__name__}: {exc}"
        else:
            send({"kind": "case", "index": raw["index"], "error": error[:1000]})
    phases.mark_cases(len(job["cases"]))
    if job.get("repeat_seed") is not None:
        repeat_answers(job, cache)
        phases.mark("repeats")
    flags = degenerate_check(path)
    phases.mark("degenerate_check")
    finish({"degenerate": flags, "phase_s": phases.seconds})


def repeat_answers(job: dict[str, Any], cache: dict[str, Any]) -> None:
    """The reference's answers for the repeat phase's emitted calls (``repeats.py``), from the
    same plan the candidate's worker follows: ``repeat_ref`` frames (shapes alone when the judge
    compares on the device and recomputes them itself)."""
    from kforge.verifier.content import rebuild
    from kforge.verifier.inputs import Case, make_inputs
    from kforge.verifier.probes import encode_tensor
    from kforge.verifier.repeats import reference_answers, repeat_plan

    raw_cases = [raw for raw in job["cases"] if raw.get("sizes") is None][:2]
    entry = cache.get(json.dumps(job.get("sizes"), sort_keys=True))
    if len(raw_cases) < 2 or entry is None:
        return
    problem, model = entry
    draw = bool(job.get("draw_on_device"))
    plan = repeat_plan(int(job["repeat_seed"]))
    try:
        bases = [make_inputs(problem, Case.from_json(raw), job["device"], draw_on_device=draw) for raw in raw_cases]
        if job.get("device_compare"):  # the judge recomputes each answer: shapes are all the parent needs
            first = next(reference_answers(model, bases, plan[:1]))[1]
            metas = [{"shape": list(t.shape), "dtype": str(t.dtype), "device": str(t.device)} for t in first]
            answers: Any = ((call, None) for call in plan)
        else:
            answers = reference_answers(model, bases, plan)
        for call, tensors in answers:
            blobs, extra = [], {}
            if tensors is not None:
                metas = []
                for t in tensors:
                    meta, blob = encode_tensor(t)
                    metas.append(meta)
                    blobs.append(blob)
                exact = exact_outputs(model, rebuild(bases[call.case], call.content), len(tensors)) \
                    if low_precision(tensors) else None
                if exact is not None:  # judged as a case is (correctness.judge_repeats)
                    extra = {"as_reference": True, "exact": []}
                    for t in exact:
                        meta, blob = encode_tensor(t)
                        extra["exact"].append(meta)
                        blobs.append(blob)
            send({"kind": "repeat_ref", "rep": call.rep, "case": int(raw_cases[call.case]["index"]),
                  "outputs": metas, **extra}, blobs)
    except Exception as exc:  # noqa: BLE001 - the reference failed on a repeat's inputs: reported
        send({"kind": "repeat_ref", "error": f"{type(exc).__name__}: {exc}"[:1000]})


def degenerate_check(path: Path) -> list[str]:
    """The verdict note's degeneracy flags (``problems.degenerate_flags``), at the ``ci``
    sizes: they are a property of the maths, as the pipeline's problem stage checks them. At the
    timed size the check ran the reference twice more on the CPU: a median 12.5 s (up to 42 s)
    of the reference job's 23 s over the 41 round-0 verifications of the relaxed level2 run on
    the H100 host (55 s each in all), for a note."""
    from kforge.problems import degenerate_flags
    from kforge.verifier.inputs import load_case_problem

    try:
        return degenerate_flags(load_case_problem(path, "ci", None))
    except Exception as exc:  # noqa: BLE001 - a note, never a verdict
        return [f"unchecked: {type(exc).__name__}"]


def main() -> None:
    global NONCE, RESULT_FD, send, finish, fail
    job = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    NONCE = bytes.fromhex(job.pop("nonce"))
    RESULT_FD = int(os.environ.pop("KFORGE_RESULT_FD"))
    os.set_inheritable(RESULT_FD, False)
    send, finish, fail = open_channel(RESULT_FD, NONCE)
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        fail("harness_error", exc)
        return
    if job["device"] == "cuda" and not torch.cuda.is_available():
        fail("no_device", "CUDA is not available in the worker")
    torch.set_num_threads(int(job.get("threads") or torch.get_num_threads()))
    mode = job["mode"]
    if mode == "reference":
        run_reference(job)
    elif mode in ("candidate", "timed_candidate"):
        from kforge.verifier.candidate_run import run_candidate, run_timed_candidate

        {"candidate": run_candidate, "timed_candidate": run_timed_candidate}[mode](job, send, finish, fail)
    elif mode in ("timed_reference", "compile_cache"):
        from kforge.verifier.timed_worker import run_compile_cache, run_timed_reference

        {"timed_reference": run_timed_reference, "compile_cache": run_compile_cache}[mode](job, send, finish, fail)
    else:
        fail("harness_error", f"unknown worker mode {mode!r}")


def entry() -> None:
    """The process's entry (``python -m kforge.verifier.worker_main``): this module is imported
    once, under its own name, so the functions ``Integrity`` watches are the live ones."""
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - anything left is reported, then we exit
        if RESULT_FD >= 0 and NONCE:
            try:
                fail("crashed", exc)
            except BaseException:  # noqa: BLE001
                os._exit(3)
        traceback.print_exc()
        os._exit(3)
    os._exit(4)  # main returned without a final frame: the parent reports a crash
