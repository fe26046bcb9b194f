"""``verify_candidate``: static checks, a reference run, a candidate run, a parent-side verdict.

    static_check ──reject──> Verdict(reason)            (nothing executed)
        │ok
    reference worker (cached by problem/preset/cases)   Model on every case, shape case chosen
    candidate worker (fresh, sandboxed)                 ModelNew on the same cases + probes
        │frames (raw bytes, nonce)
    correctness.judge in the parent ──> Verdict

The reference never runs in the candidate's process: its outputs cannot be found there, and a
candidate cannot patch it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

from kforge.schema import TOLERANCES, Policy, Verdict
from kforge.verifier.checks import static_check
from kforge.verifier.correctness import INPUTS_DIFFERED, judge, judge_repeats, max_margin
from kforge.verifier.inputs import plan_cases
from kforge.verifier.protocol import Frame
from kforge.verifier.reasons import Reason
from kforge.verifier.runner import JobOutcome, build_folder, run_job
from kforge.verifier.sandbox import Limits
from kforge.verifier.sandbox_view import foreign_libraries

MODEL_SEED = 42
Compare = Literal["auto", "host", "device"]
REFERENCE_CACHE_VERSION = "5"  # 2: TF32 off; 3: float64 outputs of stress cases; 4: repeat answers; 5: binary blobs
# What the reference may send back: its outputs for every case and repeat call (a 126 MB
# ConvTranspose3d output x 22 calls is 2.8 GB). The candidate's cap is then sized from what the
# reference sent (:func:`candidate_limits`), so a large problem fits and a flood still stops.
REFERENCE_RESULT_BYTES = 12 * 1024**3


@functools.cache
def _reference_code_digest() -> str:
    """The code that makes the reference's frames (inputs, worker, problem loading): a change
    to any of it is a new cache key, so frames from older code are never reused."""
    import kforge.problems as problems
    import kforge.verifier.content as content
    import kforge.verifier.inputs as inputs
    import kforge.verifier.repeats as repeats
    import kforge.verifier.worker as worker

    h = hashlib.sha256()
    for mod in (inputs, worker, problems, content, repeats):
        h.update(Path(str(mod.__file__)).read_bytes())
    return h.hexdigest()


def host_secret() -> bytes:
    """32 random bytes kept beside the reference cache (0600), made once per host: what makes
    the repeat phase's contents and picks unpredictable to a candidate, which never sees that
    folder (``sandbox_view.py``), while the reference's cached answers for them stay valid."""
    path = reference_cache_dir() / "secret"
    try:
        data = path.read_bytes()
        if len(data) == 32:
            return data
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".secret.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(os.urandom(32))
    try:
        os.link(tmp, path)  # the first writer wins; everyone reads what it wrote
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_bytes()


def repeat_seed(problem_source: str) -> int:
    """The repeat phase's plan seed for a problem (``repeats.repeat_plan``)."""
    h = hashlib.sha256(host_secret() + problem_source.encode()).digest()
    return int.from_bytes(h[:7], "little")


def reference_cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kforge" / "reference"
    return Path(os.environ.get("KFORGE_REFERENCE_CACHE", default))


def write_frames(path: Path, frames: list[Frame]) -> None:
    """Frames as one JSON line (each header and its blobs' lengths), then the blobs' raw bytes."""
    index = [{"header": f.header, "sizes": [len(b) for b in f.blobs]} for f in frames]
    with path.open("wb") as fh:
        fh.write(json.dumps(index).encode() + b"\n")
        for f in frames:
            for b in f.blobs:
                fh.write(b)


def read_frames(path: Path) -> list[Frame]:
    """What :func:`write_frames` wrote; ValueError for a file cut short or with bytes left over."""
    with path.open("rb") as fh:
        index = json.loads(fh.readline())
        frames = []
        for entry in index:
            blobs = [fh.read(n) for n in entry["sizes"]]
            if any(len(b) != n for b, n in zip(blobs, entry["sizes"], strict=True)):
                raise ValueError(f"{path.name}: cut short")
            frames.append(Frame(entry["header"], blobs))
        if fh.read(1):
            raise ValueError(f"{path.name}: bytes after the last blob")
    return frames


def candidate_limits(limits: Limits, reference: JobOutcome) -> Limits:
    """The candidate's limits with room for the results the reference sent (twice them, plus
    64 MB for headers), never less than the default cap."""
    sent = sum(len(b) for f in reference.frames for b in f.blobs)
    return dataclasses.replace(limits, result_bytes=max(limits.result_bytes, 2 * sent + 64 * 1024**2))


def _reference(job: dict[str, Any], *, scratch: Path | None, env: dict[str, str], limits: Limits,
               gpu: bool, ro_paths: list[Path], fresh: bool = False) -> JobOutcome:
    """The reference run, cached by everything it depends on (frames stored, nonce-free);
    ``fresh`` runs it again and replaces the cached frames."""
    problem_source = Path(job["problem_path"]).read_bytes()
    key = hashlib.sha256(json.dumps(
        [REFERENCE_CACHE_VERSION, _reference_code_digest(), hashlib.sha256(problem_source).hexdigest(), job, sys.version,
         sys.executable, sorted(env.items())], sort_keys=True, default=str).encode()).hexdigest()
    path = reference_cache_dir() / f"{key}.frames"
    if path.is_file() and not fresh:
        try:
            return JobOutcome(read_frames(path), None, "", "cache", 0.0)
        except (ValueError, KeyError, TypeError, OSError):
            path.unlink(missing_ok=True)
    outcome = run_job(job, scratch_root=scratch, env_extra=env, limits=limits, gpu=gpu, ro_paths=ro_paths)
    if outcome.reason is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        write_frames(tmp, outcome.frames)
        os.replace(tmp, path)
    return outcome


def verify_candidate(
    source: str, problem_path: Path, *, platform: str, policy: Policy, preset: str = "ci",
    sizes: dict[str, int] | None = None, build_dir: Path | None = None, trials: int = 3,
    timeout_s: float = 120, memory_mb: int = 4096, scratch: Path | None = None,
    compare: Compare = "auto", whole_model: bool = False,
) -> Verdict:
    """Verify one candidate; never raises for anything the candidate does. ``whole_model``: a
    stitched model (kforge.models) whose regions without a kernel of their own are the
    reference's own operations: no static checks and no launch checks, and no case at other
    sizes (it is cut for the sizes its kernels were made at); every other check (values,
    repeats, the sandbox, global state, the harness) as for any candidate. ``compare``:
    ``auto`` compares a CUDA candidate's outputs on the device (``gpu_compare.py``: CUDA IPC to
    a trusted judge, no trip through host memory) and any other as bytes in the parent
    (``host``); ``device`` / ``host`` force one (``device`` on a CPU platform runs the same judge
    with the outputs passed through scratch files: the tests' way to run that path without a
    GPU)."""
    return run_verification(source, problem_path, platform=platform, policy=policy, preset=preset,
                            sizes=sizes, build_dir=build_dir, trials=trials, timeout_s=timeout_s,
                            memory_mb=memory_mb, scratch=scratch, compare=compare, static=not whole_model,
                            launch_checks=not whole_model, other_sizes=not whole_model, whole_model=whole_model)


def run_verification(
    source: str, problem_path: Path, *, platform: str, policy: Policy, preset: str = "ci",
    sizes: dict[str, int] | None = None, build_dir: Path | None = None, trials: int = 3,
    timeout_s: float = 120, memory_mb: int = 4096, scratch: Path | None = None,
    static: bool = True, max_pids: int = 256, compare: Compare = "auto", launch_checks: bool = True,
    other_sizes: bool = True, whole_model: bool = False,
) -> Verdict:
    """``verify_candidate`` with knobs for tests: ``static=False`` exercises the dynamic layer
    alone, as if a pattern had slipped past the AST checks. ``launch_checks`` and
    ``other_sizes`` (the shape-specialisation case) are off for a stitched whole model;
    ``whole_model`` also has the reference answer every case in float64 too, for the
    ``as_reference`` rule (``correctness.against_exact``)."""
    start = time.monotonic()
    tol = TOLERANCES[policy]

    def verdict(reason: Reason, detail: str = "", **kw: Any) -> Verdict:
        return Verdict(ok=reason is Reason.OK, reason=reason.value, detail=detail[:2000], policy=policy,
                       atol=tol, rtol=tol, seconds=time.monotonic() - start, preset=preset, **kw)

    problem_path = Path(problem_path).resolve()
    try:
        problem_source = problem_path.read_text()
    except OSError as err:
        return verdict(Reason.HARNESS_ERROR, f"cannot read problem {problem_path.name}: {err.strerror}")
    if static:
        findings = [f for f in static_check(source, problem_source, platform=platform)
                    if policy == "strict" or not f.strict_only]
        if findings:
            return verdict(findings[0].reason, "; ".join(str(f) for f in findings[:5]), sandbox="none")
    from kforge.platforms import UnknownPlatformError, get_platform
    from kforge.platforms.base import sandbox_inputs

    try:
        plat = get_platform(platform)
        device = plat.device()
        info = plat.describe()
    except (UnknownPlatformError, ImportError) as err:
        return verdict(Reason.HARNESS_ERROR, str(err))
    if not info.runnable:
        return verdict(Reason.NO_DEVICE, f"platform {platform} cannot run here: {info.reason}", device=device)
    build = build_folder(platform, build_dir)
    env = plat.worker_env(build)
    gpu = device == "cuda"
    hidden = foreign_libraries(problem_source) if getattr(plat, "hides_foreign_libraries", False) else []
    on_device = compare == "device" or (compare == "auto" and gpu)
    # on the device: the judge (a second process with its own CUDA context) shares the limits,
    # and the stress inputs are drawn on the host at the timed size
    limits = Limits(timeout_s=timeout_s * (2 if on_device else 1),
                    memory_mb=max(memory_mb, 32768) if on_device else memory_mb, max_pids=max_pids)

    def once(fresh: bool) -> Verdict:
        cases = [c.to_json() for c in plan_cases(trials, None)]
        shape_index = len(cases)
        if other_sizes:
            cases.append({"index": shape_index, "seed": 99991, "dist": "native", "sizes": "auto"})
        ref_job = {"mode": "reference", "problem_path": str(problem_path), "preset": preset,
                   "sizes": sizes, "cases": cases, "device": device, "model_seed": MODEL_SEED,
                   "repeat_seed": repeat_seed(problem_source)}
        if whole_model:
            ref_job["whole_model"] = True
        if on_device:
            ref_job.update(device_compare=True, draw_on_device=True)
        ro = [*sandbox_inputs(plat, source, build), problem_path.parent]
        ref_limits = Limits(timeout_s=max(timeout_s, 300), memory_mb=None, result_bytes=REFERENCE_RESULT_BYTES)
        ref = _reference(ref_job, scratch=scratch, env=env, limits=ref_limits, gpu=gpu,
                         ro_paths=ro, fresh=fresh)
        extra: dict[str, Any] = {"sandbox": ref.mode if ref.mode != "cache" else "", "device": device,
                                 "interpreted": bool(info.interpreted), "compared_on": "device" if on_device else "host",
                                 "phase_s": {"reference": round(ref.seconds, 3)}}
        if ref.mode != "cache":
            extra["phase_s"].update(worker_phases("reference", ref.done))
        if ref.reason is not None:
            return verdict(Reason.HARNESS_ERROR, f"reference run failed: {ref.reason}: {ref.detail}", **extra)
        ref_cases = {int(f.header["index"]): f for f in ref.frames if f.header.get("kind") == "case"}
        if all("error" in f.header for f in ref_cases.values()) or "error" in ref_cases.get(0, Frame({"error": 1})).header:
            return verdict(Reason.HARNESS_ERROR, f"reference failed: {ref_cases.get(0, Frame({})).header.get('error')}", **extra)
        shape_frame = ref_cases.get(shape_index)
        if shape_frame is not None and "error" not in shape_frame.header:
            cases[shape_index]["sizes"] = shape_frame.header["sizes"]
        elif other_sizes:  # the reference took none of the other sizes: no such case
            cases.pop()
        cand_job = dict(ref_job, mode="candidate", cases=cases, tol=tol, hidden=hidden)
        link = None
        if on_device:
            from kforge.verifier.gpu_compare import JudgeLink

            link = JudgeLink()
        out = run_job(cand_job, scratch_root=scratch, env_extra=env, limits=candidate_limits(limits, ref), gpu=gpu,
                      candidate_source=source, ro_paths=ro, companion=link, hide=hidden)
        extra["sandbox"] = out.mode
        extra["phase_s"]["candidate"] = round(out.seconds, 3)
        extra["phase_s"].update(worker_phases("candidate", out.done))
        notes = _notes(ref)
        if link is not None and out.reason in (None, Reason.HARNESS_ERROR, Reason.CRASHED):
            probe = link.results.get(("probe", 0))
            if probe is None or probe[0].kind is not None:  # before any candidate code: the host's fault
                why = "; ".join(link.errors[:2]) or out.detail or "the judge never answered"
                return verdict(Reason.HARNESS_ERROR, (
                    "the on-device comparison does not work here: a tensor the harness shared before "
                    f"any candidate code ran did not reach the judge intact ({why[:600]}); verify with "
                    "compare='host' (verify.compare: host; with verify.preset: ci for GPU-scale outputs)"), **extra)
        if out.reason is not None:
            return verdict(out.reason, out.detail + notes, **extra)
        answers = None
        if link is not None:
            answers = link.results
            if link.errors:  # the judge could not compare what it was handed
                return verdict(Reason.CRASHED, "the on-device comparison failed: " + "; ".join(link.errors[:3]) + notes,
                               **extra)
        cand_cases = {int(f.header["index"]): f for f in out.frames if f.header.get("kind") == "case"}
        j = judge(ref_cases, cand_cases, tol=tol, strict=policy == "strict",
                  shape_index=shape_index if shape_index in ref_cases and len(cases) > shape_index else None,
                  platform=platform, on_device=answers, launch_checks=launch_checks)
        extra.update(margins=j.margins, max_margin=max_margin(j.margins))
        if j.reason is Reason.OK and (out.done.get("tampered") or out.done.get("global_state")):
            moved, state = out.done.get("tampered") or [], out.done.get("global_state") or []
            reason = Reason.HARNESS_TAMPERING if moved else Reason.GLOBAL_STATE_TAMPERING
            return verdict(reason, "after the cases: " + "; ".join([*moved, *state][:6]) + notes, **extra)
        if j.reason is Reason.OK:
            repeats = [f for f in out.frames if f.header.get("kind") == "repeat"]
            ref_repeats = [f for f in ref.frames if f.header.get("kind") == "repeat_ref"]
            stale = judge_repeats(ref_cases, ref_repeats, repeats, tol, on_device=answers)
            if stale is not None:
                return verdict(stale.reason, stale.detail + notes, trials=j.cases, max_abs_err=stale.max_abs_err,
                               rel_err_norm=stale.rel_err_norm, **extra)
        return verdict(j.reason, j.detail + notes, trials=j.cases, max_abs_err=j.max_abs_err,
                       rel_err_norm=j.rel_err_norm, **extra)

    first = once(fresh=False)
    if first.reason != Reason.MUTATES_INPUT.value or INPUTS_DIFFERED not in first.detail:
        return first
    # The inputs are drawn twice, in the reference's process and in the candidate's, from the
    # same seeds; a candidate whose import touches the RNG or the inputs differs every time.
    # A difference that does not come back with a freshly run (uncached) reference and a
    # second candidate run is the harness's, not the candidate's (seen rarely, cause unknown:
    # the per-input digests in the detail are there to find it); it is noted, not failed.
    second = once(fresh=True)
    if second.reason == Reason.MUTATES_INPUT.value and INPUTS_DIFFERED in second.detail:
        return second
    note = f" [a first run said: {first.detail[:300]}; not reproduced with an uncached reference]"
    return second.model_copy(update={"detail": (second.detail + note)[:2000]})


def worker_phases(job: str, done: dict[str, Any]) -> dict[str, float]:
    """A worker's own account of its seconds (``startup``, ``first_case``, ``cases``; the
    candidate's also ``judge_start``, ``import_candidate``, ``repeats``), as ``JOB.PHASE`` keys
    beside the parent's ``JOB`` total; nothing when the job did not finish."""
    raw = done.get("phase_s") if isinstance(done, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {f"{job}.{k}": round(float(v), 3) for k, v in raw.items()
            if isinstance(k, str) and isinstance(v, int | float) and v == v}


def _notes(ref: JobOutcome) -> str:
    flags = [f for f in ref.done.get("degenerate", []) if f]
    return f" [problem degenerate: {', '.join(flags)}]" if flags else ""
