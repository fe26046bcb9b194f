"""The worker's side of a timing (``handshake.py``, ``conductor.py``): its callables on input
sets it refills in place, one clocked window per CALL.

Two kinds of worker serve a timing, in processes of their own::

    timed_reference   never imports a candidate: the reference (eager) and torch.compile of it,
                      the problem's FLOPs and bytes, and afterwards the reference's answers
                      for the contents the judge checks (``oracle``)
    timed_candidate   ModelNew (``candidate_run.run_timed_candidate``): its outputs of the
                      checked calls go to the judge

so nothing a candidate does in its process (a global hook, a patched module, threads left
running) reaches the baselines, the reference's answers or the comparison.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kforge.verifier.content import Caps, Content, LiveSet, capabilities, rebuild
from kforge.verifier.handshake import ACK, HELLO, MAX_BATCH, NAMES, Channel, calibrate

SLOTS = 2
# Bytes of the input sets of one CPU batch: a batch's calls each read their own set, so the sets
# must stay cache-resident as a lone call's freshly refilled set is; 2 MB inputs in 8 sets timed
# 3-5x slower a call than one set on the dev host (its L2: 512 KiB).
BATCH_BUDGET = 512 << 10
Keep = Callable[[int, Content, Any], None]  # (tag, content, output) -> to the judge


def sets_for(base: list[Any], budget_bytes: int = BATCH_BUDGET, most: int = MAX_BATCH) -> int:
    """How many input sets of ``base``'s inputs fit ``budget_bytes`` (at most ``most``; below 2
    means no batches)."""
    size = sum(v.numel() * v.element_size() for v in base if isinstance(v, torch.Tensor))
    return int(min(most, budget_bytes // max(size, 1)))


@dataclass
class TimedSide:
    """One worker's callables and input sets (all alive at once: no two share an address)."""

    fns: dict[str, Callable[..., Any]]
    base: list[Any]
    device: str
    caps: list[Caps] = field(default_factory=list)
    sets: list[LiveSet] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.caps = capabilities(self.base)
        n = SLOTS if self.device == "cuda" else max(SLOTS, sets_for(self.base))
        self.sets = [LiveSet(self.base, self.caps) for _ in range(n)]

    @property
    def capacity(self) -> int:
        """The largest batch the sets allow (1: no batches)."""
        return 1 if self.device == "cuda" or len(self.sets) < 2 or sets_for(self.base) < 2 else len(self.sets)


def output_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of an output (exactly torch.Tensor, alone or in a tuple or list)."""
    if type(out) is torch.Tensor:
        return [out]
    if type(out) in (tuple, list):
        return [t for t in out if type(t) is torch.Tensor]
    return []


def _shares_storage(outputs: list[Any]) -> bool:
    """Two of these (live) outputs share storage: the callable hands back one buffer it
    rewrites, so a batch's earlier answers cannot be held after the batch."""
    seen: set[int] = set()
    for out in outputs:
        for t in output_tensors(out):
            if t.numel():
                ptr = t.untyped_storage().data_ptr()
                if ptr in seen:
                    return True
                seen.add(ptr)
    return False


def _batch(fn: Callable[..., Any], args: list[Any]) -> Callable[[], list[Any]]:
    """The timed body of one CPU window: ``fn`` on each input set in turn, every output held
    (the parent picks the checked one after the window)."""
    return lambda: [fn(*a) for a in args]


def _on_device(fn: Callable[..., Any], args: Any) -> Callable[[], tuple[float, float, Any]]:
    from kforge.verifier.timing import time_cuda

    return lambda: time_cuda(lambda: fn(*args))


def _events(result: tuple[float, float, Any]) -> tuple[int, int]:
    """A GPU window's claim: its CUDA events' and its host clock's nanoseconds."""
    return int(result[0] * 1e6), int(result[1] * 1e6)


def serve(channel: Channel, side: TimedSide, *, keep: Keep | None = None,
          handlers: dict[str, Callable[[dict[str, Any]], None]] | None = None) -> dict[str, Any]:
    """Answer the parent's commands until ``bye`` (returned); ``handlers`` take other commands
    (each answered with an ACK)."""
    from kforge.verifier.timing import L2Flush

    flush = L2Flush(side.device)
    cuda = side.device == "cuda"
    channel.say(HELLO, 0, 0, side.capacity, sum(1 << NAMES.index(n) for n in side.fns))
    with torch.no_grad():
        while True:
            msg = channel.receive()
            if msg is None:
                raise EOFError("the parent hung up")
            op = msg.get("op")
            if op == "bye":
                return msg
            if op == "null":
                calibrate(channel, int(msg["n"]))
                channel.say(ACK)
            elif op == "warm":
                fn = side.fns[str(msg["name"])]
                outs = [fn(*side.sets[i % len(side.sets)].load(Content.from_json(c)))
                        for i, c in enumerate(msg["contents"])]
                reuse = _shares_storage(outs)
                del outs
                if cuda:
                    torch.cuda.synchronize()
                channel.say(ACK, 0, 0, int(reuse))
            elif op == "call":
                name, rep = str(msg["name"]), int(msg["rep"])
                slots, contents = list(msg["slots"]), [Content.from_json(c) for c in msg["contents"]]
                fn = side.fns[name]
                args = [None] * len(slots)
                for j in reversed(range(len(slots))):  # the first call's inputs touched last
                    args[j] = side.sets[slots[j]].load(contents[j])
                flush()
                if cuda:
                    torch.cuda.synchronize()  # the flush ends outside the parent's window
                    outs = [channel.clock(name, rep, _on_device(fn, args[0]), claim=_events)[2]]
                else:
                    outs = channel.clock(name, rep, _batch(fn, args), k=len(slots))
                del args
                if msg.get("checked"):
                    decision = channel.receive()
                    if decision is None or decision.get("op") != "keep":
                        raise EOFError("a KEEP was due")
                    j = int(decision["index"])
                    if j >= 0 and keep is not None:
                        keep(int(decision["tag"]), contents[j], outs[j])
                    del outs
                    channel.say(ACK)
                else:
                    del outs
            elif handlers and op in handlers:
                handlers[op](msg)
                channel.say(ACK)
            else:
                raise EOFError(f"unknown command {op!r}")


# --------------------------------------------------------------------------- the reference's worker


def reference_side(job: dict[str, Any]) -> tuple[Any, Any, list[Any]]:
    """The job's problem, its reference model and the timing's base inputs (case 0's native
    draw, on the device), made the same way in every process that needs them: the reference's
    timing worker, the warm job that compiles its baseline, the candidate's worker, the judge."""
    from kforge.verifier.inputs import Case, load_case_problem, make_inputs
    from kforge.verifier.worker import build_models

    device, seed = job["device"], int(job["model_seed"])
    problem = load_case_problem(Path(job["problem_path"]), job["preset"], job.get("sizes"))
    ref = build_models(problem, None, seed, device)[0]
    base = make_inputs(problem, Case(0, seed, "native", None), device, draw_on_device=True)
    return problem, ref, base


def compile_reference(problem: Any, seed: int, device: str, inputs: list[Any]) -> Any:
    """torch.compile's baseline: a reference of its own, compiled and called once on ``inputs``."""
    from kforge.verifier.worker import build_models

    compiled = torch.compile(build_models(problem, None, seed, device)[0])
    with torch.no_grad():
        compiled(*inputs)
    return compiled


def run_compile_cache(job: dict[str, Any], send: Any, finish: Any, fail: Any) -> None:
    """No candidate here: torch.compile of the reference exactly as :func:`run_timed_reference`
    makes it (same inputs, seed and threads), so the inductor and Triton caches of this job's
    scratch folder hold what a later timing job loads instead of compiling (compile_cache.py).

    ``job["problems"]`` (``[{"name", "problem_path"}]``) compiles each in turn into the same
    caches, one frame each as it ends: inductor's start in a fresh process (its imports, the
    vector-ISA probes it compiles) was ~8 s of a 9 s first compile on the CPU host, a later
    problem's compile ~1 s. One that fails is reported and the next one compiles."""
    from kforge.verifier.timing import pin_cpu
    from kforge.verifier.worker import Phases

    device, seed = job["device"], int(job["model_seed"])
    if device == "cpu":
        pin_cpu(job.get("threads"))
    items = job.get("problems") or [{"name": "", "problem_path": job["problem_path"]}]
    phases = Phases()
    for item in items:
        sub = dict(job, problem_path=item["problem_path"])
        try:
            problem, _, base = reference_side(sub)
            phases.mark("prepare")
            compile_reference(problem, seed, device, base)
            phases.mark("compile_baseline")
        except Exception as exc:  # noqa: BLE001 - the problem's own code, or inductor, failed
            if len(items) == 1:
                fail("harness_error", exc)
            send({"kind": "compile_cache", "name": item["name"], "ok": False,
                  "detail": f"harness_error: {type(exc).__name__}: {exc}"[:1000], "phase_s": phases.seconds})
        else:
            send({"kind": "compile_cache", "name": item["name"], "ok": True, "phase_s": phases.seconds})
        phases = Phases()
        phases.seconds.pop("startup", None)
    finish({})


def run_timed_reference(job: dict[str, Any], send: Any, finish: Any, fail: Any) -> None:
    """The reference's side of a timing (module docstring): trusted code only."""
    from kforge.verifier.probes import encode_tensor
    from kforge.verifier.timing import pin_cpu
    from kforge.verifier.worker import Phases, exact_outputs

    device, seed = job["device"], int(job["model_seed"])
    pin = pin_cpu(job.get("threads")) if device == "cpu" else {}
    phases = Phases()
    try:
        channel = Channel(os.environ)
        problem, ref, base = reference_side(job)
    except Exception as exc:  # noqa: BLE001 - the problem's own code failed: not the candidate's
        fail("problem_error", exc)
    phases.mark("prepare")
    fns: dict[str, Any] = {}
    extra: dict[str, Any] = {"pin": pin}
    if job.get("baselines"):
        fns["eager"] = ref
        if not job.get("compile_baseline", True):
            extra["compile_skipped"] = True
        else:
            try:
                fns["compiled"] = compile_reference(problem, seed, device, base)
            except Exception as exc:  # noqa: BLE001 - recorded: the eager baseline still stands
                extra["compile_error"] = f"{type(exc).__name__}: {exc}"[:500]
            phases.mark("compile_baseline")
    try:
        from kforge.problem_cost import flops_and_bytes

        flops, min_bytes = flops_and_bytes(problem)
    except Exception as exc:  # noqa: BLE001
        flops, min_bytes = 0.0, 0.0
        extra["cost_error"] = f"{type(exc).__name__}: {exc}"[:300]
    phases.mark("cost")
    send({"kind": "reference", "flops": flops, "min_bytes": min_bytes, "callables": sorted(fns), "extra": extra})
    side = TimedSide(fns, base, device)

    def oracle(msg: dict[str, Any]) -> None:
        """The reference's answers for the contents the judge checks (the parent compares)."""
        items = list(msg.get("items", []))
        deterministic = True
        for n, item in enumerate(items):
            inputs = rebuild(base, Content.from_json(item["content"]), side.caps)
            with torch.no_grad():
                out = output_tensors(ref(*inputs))
                if n == 0:
                    again = output_tensors(ref(*inputs))
                    deterministic = len(again) == len(out) and all(
                        torch.equal(a, b) for a, b in zip(again, out, strict=True))
            metas, blobs = [], []
            for t in out:
                meta, blob = encode_tensor(t)
                metas.append(meta)
                blobs.append(blob)
            header = {"kind": "oracle", "tag": int(item["tag"]), "outputs": metas, "deterministic": deterministic}
            if msg.get("exact"):
                exact = exact_outputs(ref, inputs, len(out))
                if exact is not None:
                    header["exact"] = []
                    for t in exact:
                        meta, blob = encode_tensor(t)
                        header["exact"].append(meta)
                        blobs.append(blob)
            send(header, blobs)

    try:
        serve(channel, side, handlers={"oracle": oracle})
    except EOFError as exc:
        fail("harness_error", str(exc))
    except Exception as exc:  # noqa: BLE001 - the reference raised while timed
        fail("problem_error", exc)
    phases.mark("timing")
    finish({"phase_s": phases.seconds})
