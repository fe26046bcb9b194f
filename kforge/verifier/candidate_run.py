"""Worker side of a candidate: import it, then call it on every case with probes around each call
(``candidate`` mode: verification), or serve a timing (``timed_candidate`` mode: the parent
drives, ``timed_worker.serve``). It reports facts; the parent, the reference's worker and the
judge decide.

A ``candidate`` job with ``"sanitize": true`` runs under compute-sanitizer (``sanitizer.py``):
no torch.profiler anywhere (its CUPTI subscriber competes with the sanitizer's), the device
synchronised right after each call so a fault is charged to that call, frames as usual."""

from __future__ import annotations

import json
import os
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
from kforge.verifier.content import Content
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
    global_state,
    output_report,
    precision_flags,
    profile_events,
    state_changes,
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


def refuse_foreign(exc: BaseException, job: dict[str, Any], finish: Send) -> None:
    """A numerical library this view does not hold (``sandbox_view.foreign_libraries``) was
    imported: ``foreign_compute``, whenever the import happened."""
    name = str(getattr(exc, "name", "") or "") if isinstance(exc, ModuleNotFoundError) else ""
    if name and name.split(".")[0] in job.get("hidden", []):
        finish({"error": "foreign_compute", "message": (
            f"the candidate imports {name}, a numerical library candidates on this platform do not "
            "get: do the work in your own kernel")})


def _import_candidate(job: dict[str, Any], fail: Send, finish: Send) -> tuple[Any, Integrity, LaunchCounter]:
    from kforge.verifier import worker
    from kforge.verifier.worker import load_module, warm_thread_pool

    if job.get("sanitize"):
        _warm_without_profiler()
    else:
        warm_thread_pool()
    import kforge.verifier.repeats  # noqa: F401 - the harness's modules, loaded before the snapshot
    import kforge.verifier.timed_worker  # noqa: F401

    job["flags_before"] = precision_flags()
    job["state_before"] = global_state()
    counter = LaunchCounter()
    counter.install()
    integrity = Integrity([
        (worker, "worker", ["send", "finish", "fail", "poison", "build_models"]),
        (probes, "probes", ["output_report", "encode_tensor", "background_work", "precision_flags",
                            "profile_events", "global_state"]),
        (protocol, "protocol", ["send_frame", "encode_frame", "tensor_bytes"]),
        (inputs_mod, "inputs", ["make_inputs", "digest", "input_digests", "combine"]),
        (sys.modules[__name__], "candidate_run", ["run_candidate", "run_timed_candidate"]),
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


def _state(job: dict[str, Any]) -> list[str]:
    """Global state the candidate changed since before its import (``probes.global_state``)."""
    return state_changes(job["state_before"], global_state())


def run_candidate(job: dict[str, Any], send: Send, finish: Send, fail: Send) -> None:
    from kforge.verifier.worker import Phases, build_models, poison

    phases = Phases()  # where the job's seconds went (diagnostics: candidate code runs in this process)
    device = job["device"]
    sanitize = bool(job.get("sanitize"))
    channel = None
    if job.get("device_compare"):  # before any candidate code: the judge is trusted (gpu_compare.py)
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
            refuse_foreign(exc, job, finish)
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
            "tampered": integrity.changed(), "global_state": _state(job), "ops": sorted(set(ops)),
            "ours": sorted(set(ours)), "device_kernels": sorted(set(device_kernels))[:20],
            "triton_launches": counter.triton_launches - launches,
        }, blobs)
    phases.mark_cases(len(job["cases"]))
    if not sanitize and job.get("repeat_seed") is not None:
        _repeat(job, models, module.ModelNew, send, channel)
        phases.mark("repeats")
    if channel is not None:
        channel.close()
    finish({"phase_s": phases.seconds, "tampered": integrity.changed(), "global_state": _state(job)})


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
    """The repeat phase (``repeats.py``) on the preset-size instance, cases 0 and 1; each emitted
    answer as bytes, or (``channel``) compared on the device by the judge."""
    from kforge.verifier.repeats import RepeatCall, repeat_phase, repeat_plan
    from kforge.verifier.worker import build_models

    raw_cases = [raw for raw in job["cases"] if raw.get("sizes") is None][:2]
    entry = models.get(json.dumps(None))
    if len(raw_cases) < 2 or entry is None:
        return
    problem, model = entry
    draw = bool(job.get("draw_on_device"))
    bases = [make_inputs(problem, Case.from_json(raw), job["device"], draw_on_device=draw) for raw in raw_cases]

    def emit(call: RepeatCall, tensors: list[Any]) -> None:
        raw = raw_cases[call.case]
        header = {"kind": "repeat", "rep": call.rep, "slot": call.slot, "case": int(raw["index"])}
        if channel is not None:
            spec = dict(raw, content=call.content.to_json())
            send(dict(header, outputs=channel.compare(("repeat", call.rep), spec, tensors)))
            return
        metas, blobs = [], []
        for t in tensors:
            meta, blob = encode_tensor(t)
            metas.append(meta)
            blobs.append(blob)
        send(dict(header, outputs=metas), blobs)

    try:
        repeat_phase(model, lambda: build_models(problem, model_cls, job["model_seed"], job["device"])[1],
                     bases, repeat_plan(int(job["repeat_seed"])), emit)
    except EOFError as exc:  # the judge went away: the process is suspect
        send({"kind": "repeat", "error": f"the on-device comparison stopped: {exc}"})
    except Exception as exc:  # noqa: BLE001 - candidate code raised on a repeated call
        send({"kind": "repeat", "error": f"{type(exc).__name__}: {exc}"[:2000]})


# Rows of the profiler's own (CUPTI's buffer requests carry device time but are no kernel)
PROFILER_ROWS = ("Activity Buffer Request",)


def kernel_table(fn: Callable[[], Any], device: str, calls: int = 3) -> list[dict[str, Any]]:
    """The kernel table of ``calls`` calls of ``fn`` (its inputs refilled before, by the caller:
    a refill inside the profiled calls read as extra candidate kernels, and the analysis then
    asked to fuse them and counted one call where there were three)."""
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


def run_timed_candidate(job: dict[str, Any], send: Send, finish: Send, fail: Send) -> None:
    """The candidate's side of a timing (``timed_worker.py``): ModelNew on the timing's input
    sets, served to the parent; the checked calls' outputs to the judge (as bytes to the parent,
    or on the GPU to the judge in this sandbox), the global state it left behind at the end."""
    from kforge.verifier.handshake import Channel
    from kforge.verifier.timed_worker import TimedSide, output_tensors, reference_side, serve
    from kforge.verifier.timing import pin_cpu
    from kforge.verifier.worker import Phases, build_models

    device, seed = job["device"], int(job["model_seed"])
    pin = pin_cpu(job.get("threads")) if device == "cpu" else {}
    phases = Phases()
    judge = None
    if job.get("device_compare"):  # before any candidate code: the judge is trusted (gpu_compare.py)
        from kforge.verifier.gpu_compare import DeviceChannel

        try:
            judge = DeviceChannel(job, os.environ)
        except Exception as exc:  # noqa: BLE001
            fail("harness_error", exc)
    try:
        channel = Channel(os.environ)  # the parent's wire, before any candidate code
        problem, _, base = reference_side(job)
    except Exception as exc:  # noqa: BLE001 - the problem's own code failed: not the candidate's
        fail("problem_error", exc)
    phases.mark("prepare")
    module, integrity, _ = _import_candidate(job, fail, finish)
    phases.mark("import_candidate")
    try:
        new = build_models(problem, module.ModelNew, seed, device)[1]
    except Exception as exc:  # noqa: BLE001 - ModelNew.__init__ is candidate code
        refuse_foreign(exc, job, finish)
        fail("crashed", exc)
    phases.mark("build_models")
    side = TimedSide({"candidate": new}, base, device)
    spec = {"index": 0, "seed": seed, "dist": "native", "sizes": None}

    def keep(tag: int, content: Content, out: Any) -> None:
        tensors = output_tensors(out)
        if judge is not None:
            try:
                judge.compare(("timed", tag), dict(spec, content=content.to_json()), tensors)
            except EOFError as exc:
                fail("crashed", f"the on-device comparison stopped: {exc}")
            send({"kind": "kept", "tag": tag, "content": content.to_json()})
            return
        metas, blobs = [], []
        for t in tensors:
            meta, blob = encode_tensor(t)
            metas.append(meta)
            blobs.append(blob)
        send({"kind": "kept", "tag": tag, "content": content.to_json(), "outputs": metas}, blobs)

    def fresh(msg: dict[str, Any]) -> None:
        content = Content.from_json(msg["content"])
        other = build_models(problem, module.ModelNew, seed, device)[1]
        values = side.sets[0].load(content)
        for which, instance in (("fresh", other), ("timed", new)):
            keep(int(msg["tags"][which]), content, instance(*values))

    try:
        bye = serve(channel, side, keep=keep, handlers={"fresh": fresh})
        phases.mark("timing")
        if bye.get("table"):  # the analysis agent's evidence: the kernels of three calls
            values = side.sets[0].load(Content.from_json(bye["table"]))
            with torch.no_grad():
                send({"kind": "kernels", "rows": kernel_table(lambda: new(*values), device)})
            phases.mark("kernel_table")
    except EOFError as exc:
        fail("crashed", f"the timing stopped: {exc}")
    except Exception as exc:  # noqa: BLE001 - candidate code raised while timed
        refuse_foreign(exc, job, finish)
        fail("crashed", exc)
    if judge is not None:
        judge.close()
    send({"kind": "state", "tampered": integrity.changed(), "global_state": _state(job),
          "flags": precision_flags(), "flags_before": job["flags_before"], "pin": pin})
    finish({"phase_s": phases.seconds})
