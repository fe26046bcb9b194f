"""Worker side of a candidate: import it, call it on every case with probes around each call
(``candidate`` mode), or time it against the baselines (``profile`` mode).

A ``candidate`` job with ``"sanitize": true`` runs under compute-sanitizer (``sanitizer.py``):
no torch.profiler anywhere (its CUPTI subscriber competes with the sanitizer's), the device
synchronised right after each call so a fault is charged to that call, frames as usual."""

from __future__ import annotations

import functools
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from kforge.schema import GRAPH_LAUNCH_ROW
from kforge.verifier import inputs as inputs_mod
from kforge.verifier import probes, protocol
from kforge.verifier.inputs import (
    Case,
    combine,
    digest,
    input_digests,
    load_case_problem,
    make_inputs,
)
from kforge.verifier.probes import (
    Integrity,
    LaunchCounter,
    background_work,
    encode_tensor,
    output_report,
    precision_flags,
    profile_events,
)

Send = Callable[..., None]


def _activities(device: str) -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _warm_without_profiler() -> None:
    """``warm_thread_pool`` less its profiler pass (sanitized runs keep CUPTI out)."""
    import torch._dynamo  # noqa: F401 - rewraps torch.manual_seed on import: before snapshots

    a = torch.randn(1 << 18)
    (a * a).sum()


def _import_candidate(job: dict[str, Any], fail: Send, finish: Send) -> tuple[Any, Integrity, LaunchCounter]:
    from kforge.verifier import worker
    from kforge.verifier.worker import load_module, warm_thread_pool

    if job.get("sanitize"):
        _warm_without_profiler()
    else:
        warm_thread_pool()
    job["flags_before"] = precision_flags()
    counter = LaunchCounter()
    counter.install()
    integrity = Integrity([
        (worker, "worker", ["send", "finish", "fail", "poison", "build_models"]),
        (probes, "probes", ["output_report", "encode_tensor", "background_work", "precision_flags",
                            "profile_events"]),
        (protocol, "protocol", ["send_frame", "encode_frame"]),
        (inputs_mod, "inputs", ["make_inputs", "digest", "input_digests", "combine"]),
        (sys.modules[__name__], "candidate_run", ["run_candidate", "run_profile"]),
    ])
    try:
        module = load_module(Path(job["candidate_path"]), "kforge_candidate")
    except BaseException as exc:  # noqa: BLE001 - SystemExit and friends count as import errors
        refuse_foreign(exc, job, finish)
        fail("import_error", exc)
    moved = integrity.changed()
    if moved:
        finish({"error": "harness_tampering", "message": "candidate replaced " + ", ".join(moved[:8])})
    if not isinstance(getattr(module, "ModelNew", None), type):
        finish({"error": "no_model_new", "message": "the candidate module defines no class ModelNew"})
    return module, integrity, counter


def refuse_foreign(exc: BaseException, job: dict[str, Any], finish: Send) -> None:
    """A numerical library this view does not hold (``sandbox_view.foreign_libraries``) was
    imported: ``foreign_compute``, whenever the import happened."""
    name = str(getattr(exc, "name", "") or "") if isinstance(exc, ModuleNotFoundError) else ""
    if name and name.split(".")[0] in job.get("hidden", []):
        finish({"error": "foreign_compute", "message": (
            f"the candidate imports {name}, a numerical library candidates on this platform do not "
            "get: do the work in your own kernel")})


def run_candidate(job: dict[str, Any], send: Send, finish: Send, fail: Send) -> None:
    from kforge.verifier.worker import Phases, build_models, poison

    phases = Phases()  # where the job's seconds went (diagnostics: candidate code runs in this process)
    device = job["device"]
    sanitize = bool(job.get("sanitize"))
    channel = None
    if job.get("device_compare"):  # before any candidate code: the judge is trusted (gpu_compare.py)
        import os

        from kforge.verifier.gpu_compare import DeviceChannel

        try:
            channel = DeviceChannel(job, os.environ)
        except Exception as exc:  # noqa: BLE001
            fail("harness_error", exc)
    draw = bool(job.get("draw_on_device"))
    harness = frozenset({channel.proc.pid}) if channel is not None else frozenset()
    phases.mark("judge_start")
    module, integrity, counter = _import_candidate(job, fail, finish)
    phases.mark("import_candidate")
    path = Path(job["problem_path"])
    models: dict[str, tuple[Any, Any]] = {}
    for i, raw in enumerate(job["cases"]):
        phases.mark_cases(i)
        case = Case.from_json(raw)
        key = json.dumps(case.sizes, sort_keys=True)
        try:
            if key not in models:
                sizes = case.sizes if case.sizes is not None else job.get("sizes")
                problem = load_case_problem(path, job["preset"], sizes)
                models[key] = (problem, build_models(problem, module.ModelNew, job["model_seed"], device)[1])
            problem, model = models[key]
            inputs = make_inputs(problem, case, device, draw_on_device=draw)
        except Exception as exc:  # noqa: BLE001 - ModelNew.__init__ is candidate code
            send({"kind": "case", "index": case.index, "error": f"{type(exc).__name__}: {exc}"})
            continue
        each = input_digests(inputs)
        before = combine(each)
        poison(2 * sum(t.numel() * t.element_size() for t in inputs_mod.tensors_in(inputs)), device)
        threads_before = {t.ident for t in threading.enumerate()}
        launches = counter.triton_launches
        ops: list[str] = []
        ours: list[str] = []
        device_kernels: list[str] = []
        try:
            with torch.no_grad():
                if sanitize:
                    out = model(*inputs)
                    _sync(device)
                elif case.index == 0:
                    with profile(activities=_activities(device)) as prof:
                        out = model(*inputs)
                        _sync(device)
                    ops, ours, device_kernels = profile_events(prof)
                else:
                    out = model(*inputs)
        except Exception as exc:  # noqa: BLE001 - the candidate raised: reported per case
            from kforge.verifier.worker import _is_device_error, _is_oom

            if _is_oom(exc) or _is_device_error(exc):
                fail("crashed", exc)  # remapped to oom / device_error: the process is suspect
            refuse_foreign(exc, job, finish)
            send({"kind": "case", "index": case.index, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            continue
        report, tensors = output_report(out, inputs, device)
        if "rigged" in report:
            finish({"error": "rigged_output_object", "message": report["rigged"]})
        first = [t.clone() for t in tensors]  # on the current stream, before any device sync
        background = background_work(threads_before, harness)
        _sync(device)
        if case.index == 0 or background:
            probes.settle()
        background = sorted(set(background + background_work(threads_before, harness)))
        metas, blobs = [], []
        if channel is not None:  # on the device: the judge compares; nothing crosses the host
            changed_after_return = not all(_same_bits(a, b) for a, b in zip(first, tensors, strict=True))
            try:
                metas = channel.compare(("case", case.index), raw, tensors)
            except EOFError as exc:
                fail("crashed", f"the on-device comparison stopped during case {case.index}: {exc}")
        else:
            changed_after_return = digest(first) != digest(tensors)
            for t in tensors:
                meta, blob = encode_tensor(t)
                metas.append(meta)
                blobs.append(blob)
        send({
            "kind": "case", "index": case.index, "outputs": metas, "structure": report["structure"],
            "digest": before, "input_digests": each, "digest_after": digest(inputs), "aliases": report["aliases"],
            "wrong_device": report["wrong_device"], "background": background,
            "changed_after_return": changed_after_return, "flags": precision_flags(), "flags_before": job["flags_before"],
            "tampered": integrity.changed(), "ops": sorted(set(ops)), "ours": sorted(set(ours)),
            "device_kernels": sorted(set(device_kernels))[:20],
            "triton_launches": counter.triton_launches - launches,
        }, blobs)
    phases.mark_cases(len(job["cases"]))
    if not sanitize:
        _repeat(job, models, module.ModelNew, send, channel)
        phases.mark("repeats")
    if channel is not None:
        channel.close()
    finish({"phase_s": phases.seconds})


def _same_bits(a: Any, b: Any) -> bool:
    """Bit-for-bit equal (NaN included), on the device."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    x, y = a.detach().contiguous().reshape(-1), b.detach().contiguous().reshape(-1)
    if x.element_size() in (1, 2, 4, 8) and x.numel():
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
        if not x.is_complex():
            return bool(torch.equal(x.view(view), y.view(view)))
    return bool(torch.equal(x, y))


def _repeat(job: dict[str, Any], models: dict[str, tuple[Any, Any]], model_cls: type, send: Send,
            channel: Any = None) -> None:
    """The repeat phase (``checked.repeat_phase``) on the preset-size instance, cases 0 and 1;
    each answer as bytes, or (``channel``) compared on the device by the judge."""
    from kforge.verifier.checked import repeat_phase
    from kforge.verifier.worker import build_models

    raw_cases = [raw for raw in job["cases"] if raw.get("sizes") is None][:2]
    cases = [Case.from_json(raw) for raw in raw_cases]
    entry = models.get(json.dumps(None))
    if len(cases) < 2 or entry is None:
        return
    problem, model = entry

    def emit(rep: int, slot: int, case_index: int, tensors: list[Any]) -> None:
        header = {"kind": "repeat", "rep": rep, "slot": slot, "case": case_index}
        if channel is not None:
            raw = next(r for r in raw_cases if int(r["index"]) == case_index)
            send(dict(header, outputs=channel.compare(("repeat", rep), raw, tensors)))
            return
        metas, blobs = [], []
        for t in tensors:
            meta, blob = encode_tensor(t)
            metas.append(meta)
            blobs.append(blob)
        send(dict(header, outputs=metas), blobs)

    try:
        repeat_phase(model, lambda: build_models(problem, model_cls, job["model_seed"], job["device"])[1],
                     problem, cases, job["device"], emit, draw_on_device=bool(job.get("draw_on_device")))
    except EOFError as exc:  # the judge went away: the process is suspect
        send({"kind": "repeat", "error": f"the on-device comparison stopped: {exc}"})
    except Exception as exc:  # noqa: BLE001 - candidate code raised on a repeated call
        send({"kind": "repeat", "error": f"{type(exc).__name__}: {exc}"[:2000]})


# Rows of the profiler's own (CUPTI's buffer requests carry device time but are no kernel)
PROFILER_ROWS = ("Activity Buffer Request",)


def candidate_kernels(new: Any, plan: Any, device: str, calls: int = 3) -> list[dict[str, Any]]:
    """The kernel table of ``calls`` candidate calls on the plan's first input set. The set is
    refilled before the profiler starts: its in-place refill (``InputPlan.load``) is the
    harness's work, and inside the table it read as extra candidate kernels (the analysis then
    asked to fuse them, and counted one call where there were three)."""
    values = plan.load(0, 0)
    return _kernel_table(lambda: new(*values), device, calls)


def _kernel_table(fn: Callable[[], Any], device: str, calls: int = 3) -> list[dict[str, Any]]:
    with profile(activities=_activities(device)) as prof:
        for _ in range(calls):
            fn()
        _sync(device)
    rows = []
    for e in prof.key_averages():
        dev_us = float(getattr(e, "device_time_total", 0.0) or 0.0)
        cpu_us = float(e.cpu_time_total)
        ours = e.key.startswith("kforge::") or e.key == GRAPH_LAUNCH_ROW  # a replay: how many, no device time
        if e.key in PROFILER_ROWS or (device == "cuda" and dev_us <= 0 and not ours):
            continue
        if device != "cuda" and not (ours or e.key.startswith("aten::")):
            continue
        rows.append({"name": e.key, "calls": int(e.count), "total_us": dev_us if device == "cuda" else cpu_us})
    rows.sort(key=lambda r: -r["total_us"])
    return rows[:15]


def prepare_reference(job: dict[str, Any]) -> tuple[Any, Any]:
    """The job's problem and its checked-timing plan (reference answers, input sets), made before
    any candidate code runs; raises what the problem's own code raises."""
    from kforge.verifier.checked import CheckedTiming
    from kforge.verifier.worker import build_models

    device, seed = job["device"], job["model_seed"]
    problem = load_case_problem(Path(job["problem_path"]), job["preset"], job.get("sizes"))
    with torch.no_grad():
        checked = CheckedTiming.prepare(problem, build_models(problem, None, seed, device)[0], seed,
                                        device, job["reps"], job.get("tol"))
    return problem, checked


def compile_reference(problem: Any, seed: int, device: str, inputs: list[Any]) -> Any:
    """torch.compile's baseline: a reference of its own, compiled and called once on ``inputs``."""
    from kforge.verifier.worker import build_models

    compiled = torch.compile(build_models(problem, None, seed, device)[0])
    with torch.no_grad():
        compiled(*inputs)
    return compiled


def run_compile_cache(job: dict[str, Any], send: Send, finish: Send, fail: Send) -> None:
    """No candidate here: torch.compile of the reference exactly as :func:`run_profile` makes it
    (same inputs, seed and threads), so the inductor and Triton caches of this job's scratch
    folder hold what a later timing job loads instead of compiling (kforge/verifier/compile_cache.py)."""
    from kforge.verifier.timing import pin_cpu
    from kforge.verifier.worker import Phases

    device, seed = job["device"], job["model_seed"]
    if device == "cpu":
        pin_cpu(job.get("threads"))
    phases = Phases()
    try:
        problem, checked = prepare_reference(job)
        phases.mark("prepare")
        compile_reference(problem, seed, device, checked.plan.buffers[0])
        phases.mark("compile_baseline")
    except Exception as exc:  # noqa: BLE001 - the problem's own code, or inductor, failed
        fail("harness_error", exc)
    send({"kind": "compile_cache", "phase_s": phases.seconds})
    finish({})


def run_profile(job: dict[str, Any], send: Send, finish: Send, fail: Send) -> None:
    """Checked timing (``checked.py``): the reference's answers and the input sets are made
    before the candidate is imported; on the CPU every timed call is clocked by the parent
    (``handshake.py``)."""
    import os

    from kforge.verifier.handshake import worker_clock
    from kforge.verifier.timing import (
        _host_probe,
        host_clock,
        pin_cpu,
        time_alternating,
        unbatched_clock,
    )
    from kforge.verifier.worker import Phases, build_models

    device = job["device"]
    pin = pin_cpu(job.get("threads")) if device == "cpu" else {}
    seed = job["model_seed"]
    phases = Phases()
    try:
        problem, checked = prepare_reference(job)
    except Exception as exc:  # noqa: BLE001 - the problem's own code failed: not the candidate's
        fail("harness_error", exc)
    phases.mark("prepare")
    extra: dict[str, Any] = {"pin": pin, "checked": checked.note or "checked", "input_sets": checked.plan.capacity}
    # torch.compile's baseline is compiled and warmed before any candidate code runs, on a
    # reference of its own: what the candidate does at import cannot reach the compiled graph
    # or the kernels inductor loads for it.
    compiled = None
    if job.get("baselines") and not job.get("compile_baseline", True):
        extra["compile_skipped"] = True
    elif job.get("baselines"):
        try:
            compiled = compile_reference(problem, seed, device, checked.plan.buffers[0])
        except Exception as exc:  # noqa: BLE001 - recorded: the eager baseline still stands
            compiled = None
            extra["compile_error"] = f"{type(exc).__name__}: {exc}"[:500]
        phases.mark("compile_baseline")
    # the device to itself (device_lease.py) before the first candidate code runs
    clock = worker_clock(os.environ, gate=bool(job.get("gate")))
    extra["parent_clock"] = clock is not None
    module, integrity, _ = _import_candidate(job, fail, finish)
    phases.mark("import_candidate")
    try:
        ref, new = build_models(problem, module.ModelNew, seed, device)
    except Exception as exc:  # noqa: BLE001
        fail("crashed", exc)
    phases.mark("build_models")
    fns: dict[str, Callable[..., Any]] = {"candidate": new}
    if job.get("baselines"):
        fns["eager"] = ref
    if compiled is not None:
        fns["compiled"] = compiled
    batch_ns = job.get("batch_ns")
    if clock is None:  # in-process (benchmarks/verify_cpu_clock.py): the same batches, or none
        clock = unbatched_clock if batch_ns == 0 else host_clock
        if batch_ns:  # another batch length than the default, in-process
            clock = functools.partial(host_clock)
            clock.probe = functools.partial(_host_probe, batch_ns=batch_ns)  # type: ignore[attr-defined]
    batches: dict[str, int] = {}
    try:
        with torch.no_grad():
            samples = time_alternating(fns, device=device, warmup=job["warmup"], reps=job["reps"],
                                       plan=checked.plan, clock=clock, observe=checked.observe, batches=batches)
            phases.mark("timing")
            stale = checked.verdict(module.ModelNew, new,
                                    lambda cls: build_models(problem, cls, seed, device)[1])
            phases.mark("stale_checks")
            kernels = candidate_kernels(new, checked.plan, device)
            phases.mark("kernel_table")
    except Exception as exc:  # noqa: BLE001
        fail("crashed", exc)
    moved = integrity.changed()
    if moved:
        finish({"error": "harness_tampering", "message": "candidate replaced " + ", ".join(moved[:8])})
    if stale:
        finish({"error": "stale_output", "message": stale})
    try:
        from kforge.problem_cost import flops_and_bytes

        flops, min_bytes = flops_and_bytes(problem)
    except Exception as exc:  # noqa: BLE001
        flops, min_bytes = 0.0, 0.0
        extra["cost_error"] = f"{type(exc).__name__}: {exc}"[:300]
    extra["batch"] = batches  # calls per clocked handshake, per callable
    extra["phase_s"] = phases.seconds  # where the job's time went (process start, torch import, ...)
    send({
        "kind": "profile", "timings": {k: s.timing().model_dump() for k, s in samples.items()},
        "host_gap": {k: s.host_gap() for k, s in samples.items()}, "kernels": kernels,
        "flops": flops, "min_bytes": min_bytes, "extra": extra,
    })
    finish({})
