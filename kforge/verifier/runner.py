"""Start one sandboxed worker job and turn whatever happened into frames or a reason code."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kforge.verifier.device_lease import held
from kforge.verifier.protocol import Frame, ProtocolError, decode_frames
from kforge.verifier.reasons import Reason
from kforge.verifier.sandbox import Companion, Limits, SandboxResult, python_argv, run_sandboxed

REPO_ROOT = Path(__file__).resolve().parents[2]
DETAIL_CHARS = 1500
COLLECT_BYTES = 1 << 20  # at most this much of each collected scratch file is read back
WORKER_ERRORS = {r.value for r in Reason}


@dataclass
class JobOutcome:
    frames: list[Frame]
    reason: Reason | None  # None: the worker finished and sent its final frame
    detail: str
    mode: str
    seconds: float
    returncode: int | None = None  # the sandboxed command's exit status (None: cached)
    files: dict[str, str] = field(default_factory=dict)  # ``collect``ed scratch files, as text
    streams: str = ""  # the command's stdout + stderr (capped by the sandbox, not scrubbed)

    @property
    def done(self) -> dict[str, Any]:
        return self.frames[-1].header if self.frames else {}


def scrub(text: str, scratch: Path | None) -> str:
    """Short, and free of paths outside the candidate's scratch folder."""
    if scratch is not None:
        text = text.replace(str(scratch), ".")
    text = text.replace(str(REPO_ROOT), "<kforge>")
    text = re.sub(r"(?<![\w.<])/(?:[\w.+-]+/)+[\w.+-]*", "<path>", text)
    if len(text) > DETAIL_CHARS:
        text = "[...]" + text[-DETAIL_CHARS:]
    return text.strip()


def import_paths() -> list[str]:
    """The package root plus the parent's PYTHONPATH (e.g. a wheel folder on a GPU host), so the
    worker imports exactly what the parent does. Relative entries (``PYTHONPATH=.``) are made
    absolute: the worker runs in its scratch folder, and the sandbox view binds each one."""
    extra = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [str(REPO_ROOT), *dict.fromkeys(p for p in extra if p != str(REPO_ROOT))]


def build_folder(platform: str, build_dir: Path | str | None) -> Path:
    """Where a platform's built kernels are: ``build_dir``, else ``$KFORGE_BUILD_DIR``, else
    ``~/.cache/kforge/<platform>``."""
    if build_dir:
        return Path(build_dir)
    return Path(os.environ.get("KFORGE_BUILD_DIR", Path.home() / ".cache" / "kforge" / platform))


# The device, the loader path and the toolchain that torch.utils.cpp_extension writes into a
# CUDA extension's build commands: the compile stage builds under this same environment
# (kforge/platforms/cuda.py), so a worker's ninja finds the build up to date. A worker that saw
# a different compiler, CUDA root or arch list rebuilt every extension (30 s each on the H200).
PASSED_THROUGH = ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CC", "CXX",
                  "PYTORCH_NVCC", "TORCH_CUDA_ARCH_LIST", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")


CACHE_DIRS = ("inductor", "triton")  # the compile caches worker_env points into the scratch folder
# not carried from a warm-up job into a timing job: inductor's autotuning picks (made on a GPU
# other jobs shared) and lock files; the timing job autotunes again with the machine to itself
CACHE_SKIP = ("*.best_config", "*.lock", "lock")


def worker_env(extra: dict[str, str], scratch: Path, threads: int | None) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(scratch), "TMPDIR": str(scratch), "XDG_CACHE_HOME": str(scratch / ".cache"),
        "PYTHONPATH": os.pathsep.join(import_paths()), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
        "LANG": "C.UTF-8", "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        "TRITON_CACHE_DIR": str(scratch / "triton"),
    }
    for key in PASSED_THROUGH:
        if key in os.environ:
            env[key] = os.environ[key]
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    # libgomp's threads spin up to GOMP_SPINCOUNT times (300,000 by default: milliseconds on the dev
    # host) after a parallel region before they sleep. A timing alternates between processes, and
    # the last one's spinning threads took the cores of the next one's window: a 3 ms GEMM timed
    # 3.3-7.1 ms at 2 threads; with 10,000 (about a quarter of a millisecond) 3.0-3.6 ms. Every
    # worker gets the same value, the candidate's kernels and PyTorch's alike.
    env["GOMP_SPINCOUNT"] = os.environ.get("GOMP_SPINCOUNT", "10000")
    if (os.cpu_count() or 1) <= 4:  # inductor's compile-worker pool costs ~6 s a start on 2 cores
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    env.update(extra)
    return env


def private_triton_cache(env: dict[str, str], scratch: Path, *, with_builds: bool) -> None:
    """Point Triton's cache into the scratch folder. The platform names the build folder's cache
    (where the compile stage built the candidate's kernels), which the sandbox makes read-only:
    Triton writes there even to reuse an entry, and every GPU verification failed with EROFS
    (H200, 2026-12-06). ``with_builds`` (a job that imports a candidate): the scratch cache starts
    as a copy of the build's, so the kernels are not compiled again; a copy, not links, so
    nothing the candidate writes reaches the shared cache."""
    source = env.get("TRITON_CACHE_DIR")
    private = scratch / "triton"
    if source and Path(source).resolve() != private.resolve():
        if with_builds and Path(source).is_dir():
            shutil.copytree(source, private, symlinks=True, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(*CACHE_SKIP))
        env["TRITON_CACHE_DIR"] = str(private)


def run_job(
    job: dict[str, Any], *, scratch_root: Path | None, env_extra: dict[str, str], limits: Limits,
    gpu: bool, candidate_source: str | None = None, ro_paths: list[Path] | None = None,
    argv_prefix: Callable[[Path], list[str]] | None = None, collect: Sequence[str] = (),
    companion: Companion | None = None, seed: Callable[[Path], object] | None = None,
    keep_to: Path | None = None, hide: list[str] | None = None,
) -> JobOutcome:
    """Run one worker job in a fresh scratch folder (deleted afterwards).

    ``argv_prefix(scratch)`` wraps the worker's command line in a tool run inside the sandbox
    (``compute-sanitizer ... python -m kforge.verifier.worker_main``); the ``collect`` files (names
    relative to the scratch folder, e.g. the tool's log) are read back before the folder goes.
    The candidate can write there too: treat what comes back as its word, not the tool's.
    ``seed(scratch)`` fills the scratch folder before the worker starts (compile caches);
    ``keep_to``: the worker's compile caches (``inductor/``, ``triton/``) copied there after it
    ends (a trusted job's only; both in :mod:`kforge.verifier.compile_cache`). ``hide``:
    libraries the worker must not see (``sandbox_view.foreign_libraries``)."""
    scratch = Path(tempfile.mkdtemp(prefix="kforge-run-", dir=scratch_root))
    try:
        if seed is not None:
            seed(scratch)
        if candidate_source is not None:
            (scratch / "candidate.py").write_text(candidate_source)
            job = dict(job, candidate_path=str(scratch / "candidate.py"))
        nonce = secrets.token_bytes(16)
        payload = json.dumps(dict(job, nonce=nonce.hex())).encode()
        env = worker_env(env_extra, scratch, job.get("threads"))
        private_triton_cache(env, scratch, with_builds=candidate_source is not None)
        argv = [*(argv_prefix(scratch) if argv_prefix else []), *python_argv("kforge.verifier.worker_main")]
        with held(gpu):  # this process's shares of the machine (device_lease.py); a timing trades them
            result = run_sandboxed(argv, env=env, scratch=scratch, stdin=payload, limits=limits,
                                   ro_paths=list(ro_paths or []), gpu=gpu, companion=companion, hide=hide)
        outcome = interpret(result, nonce, scratch)
        outcome.files = {name: _read_capped(scratch / name) for name in collect}
        if keep_to is not None:
            for name in CACHE_DIRS:
                if (scratch / name).is_dir():
                    shutil.copytree(scratch / name, keep_to / name, symlinks=True, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns(*CACHE_SKIP))
        return outcome
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _read_capped(path: Path) -> str:
    """The head of a scratch file as text; "" when it is missing or not a plain file."""
    try:
        if path.is_symlink() or not path.is_file():
            return ""
        with path.open("rb") as fh:
            return fh.read(COLLECT_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def interpret(result: SandboxResult, nonce: bytes, scratch: Path | None) -> JobOutcome:
    def out(reason: Reason | None, detail: str, frames: list[Frame] | None = None) -> JobOutcome:
        return JobOutcome(frames or [], reason, scrub(detail, scratch), result.mode, result.seconds,
                          returncode=result.returncode, streams=result.stdout + result.stderr)

    if result.output_flood:
        return out(Reason.OUTPUT_FLOOD, "stdout/stderr exceeded the cap; the run was stopped")
    if result.timed_out:
        return out(Reason.TIMEOUT, f"no answer within {result.seconds:.1f} s; killed\n{result.stderr[-600:]}")
    if result.result_overflow:  # cut at the cap: its last frame is torn, not forged
        return out(Reason.OUTPUT_FLOOD, "result exceeded the size cap")
    try:
        frames = decode_frames(result.result, nonce)
    except ProtocolError as err:
        # a worker killed mid-write (the memory cap, the process limit) leaves a torn frame: that
        # is its cause, not tampering (a ConvTranspose3d reference killed by the memory cap read
        # as harness_tampering: "torn blob")
        if result.oom:
            return out(Reason.OOM, f"killed by the memory limit (result pipe: {err})")
        if result.pids_limited:
            return out(Reason.PROCESS_LIMIT, f"hit the process-count limit (result pipe: {err})")
        return out(Reason.HARNESS_TAMPERING, f"result pipe: {err}")
    finished = bool(frames) and frames[-1].header.get("kind") == "done"
    if finished:
        error = frames[-1].header.get("error")
        if error:
            reason = Reason(error) if error in WORKER_ERRORS else Reason.CRASHED
            return out(reason, str(frames[-1].header.get("message", "")), frames)
        return out(None, "", frames)
    if result.oom:
        return out(Reason.OOM, "killed by the memory limit")
    if result.pids_limited:
        return out(Reason.PROCESS_LIMIT, "hit the process-count limit and died without an answer")
    tail = result.stderr[-800:]
    if "MemoryError" in tail or "can't allocate memory" in tail:
        return out(Reason.OOM, tail)
    how = f"signal {result.signal}" if result.signal else f"exit code {result.returncode}"
    return out(Reason.CRASHED, f"worker ended ({how}) without an answer\n{tail}", frames)
