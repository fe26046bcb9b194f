"""torch.compile's baseline, compiled off the critical path.

A timing owns the machine (its leases, device_lease.py), and compiling the reference with
inductor was most of a timing job: ~18 s of a 20 s profile on the CPU host. So a trusted job with no candidate in it
(:func:`warm`) compiles the reference exactly as the timing worker does and keeps its inductor
and Triton caches in a folder, with a manifest (the SHA-256 of every file). A timing job then
starts with a copy of that folder in its own scratch (:class:`Seed`), checked file by file
against the manifest before the worker starts: torch.compile finds the graph and the kernels
already built, and its compile is seconds. A copy that does not match (a file changed, added
or missing) is removed and the job compiles from nothing, as before; the profile says which
(``extra["compile_cache"]``).

What is not carried: inductor's autotuning picks (``*.best_config``), made while other jobs
shared the machine. The timing job autotunes again with the machine to itself, so the compiled
baseline is the one a cold compile gives. The compiled graph is built in the reference's timing
worker, which never imports a candidate (``timed_worker.run_timed_reference``): nothing the
candidate does reaches it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kforge.verifier.runner import CACHE_DIRS, build_folder, run_job
from kforge.verifier.sandbox import Limits


def manifest_of(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every regular file under ``folder``'s cache dirs; a
    symlink or any other kind of entry makes it unusable (ValueError)."""
    files: dict[str, str] = {}
    for name in CACHE_DIRS:
        root = folder / name
        if not root.exists():
            continue
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise ValueError(f"{rel} is not a plain file or folder")
            if path.is_file():
                files[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def warm(problem_path: Path, *, platform: str, dest: Path, preset: str, sizes: dict[str, int] | None,
         build_dir: Path | None, threads: int | None, timeout_s: float = 600) -> dict[str, Any]:
    """Compile the reference in a worker of its own and keep its caches in ``dest`` (replaced
    whole). Returns ``{"ok", "detail", "folder", "manifest", "files", "bytes", "seconds",
    "phase_s"}``; never raises for what the problem or inductor does."""
    return warm_many({"": Path(problem_path)}, platform=platform, dest=dest, preset=preset, sizes=sizes,
                     build_dir=build_dir, threads=threads, timeout_s=timeout_s)[""]


def warm_many(problems: dict[str, Path], *, platform: str, dest: Path, preset: str, sizes: dict[str, int] | None,
              build_dir: Path | None, threads: int | None, timeout_s: float = 600) -> dict[str, dict[str, Any]]:
    """:func:`warm` for several problems (a suite: one preset and sizes) in one worker, their
    caches in one folder, so inductor starts once: ``{name: result}``, each result with the
    folder's manifest, ok where that problem compiled. Kept only if at least one compiled."""
    from kforge.platforms import get_platform
    from kforge.verifier.verify import MODEL_SEED

    start = time.monotonic()
    plat = get_platform(platform)
    device = plat.device()
    build = build_folder(platform, build_dir)
    paths = {name: Path(path).resolve() for name, path in problems.items()}
    staging = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    job: dict[str, Any] = {"mode": "compile_cache", "problems": [{"name": n, "problem_path": str(p)} for n, p in paths.items()],
                           "preset": preset, "sizes": sizes, "device": device, "model_seed": MODEL_SEED,
                           "threads": threads}
    out = run_job(job, scratch_root=None, env_extra=plat.worker_env(build),
                  limits=Limits(timeout_s=timeout_s, memory_mb=None), gpu=device == "cuda",
                  ro_paths=sorted({p.parent for p in paths.values()}), keep_to=staging)
    bodies = {f.header.get("name", ""): f.header for f in out.frames if f.header.get("kind") == "compile_cache"}

    def result(name: str, **extra: Any) -> dict[str, Any]:
        body = bodies.get(name, {})
        return {"ok": False, "device": device, "phase_s": body.get("phase_s", {}),
                "seconds": round(sum(body.get("phase_s", {}).values()), 3), **extra}

    stopped = f"{out.reason.value}: {out.detail}" if out.reason else "no answer from the worker"
    failed = {n: result(n, detail=(bodies[n].get("detail") or "") if n in bodies else stopped[:1000]) for n in paths
              if not bodies.get(n, {}).get("ok", n in bodies)}
    if len(failed) == len(paths):
        shutil.rmtree(staging, ignore_errors=True)
        return failed
    try:
        manifest = manifest_of(staging)  # a link kept from the worker's caches is refused here
    except ValueError as err:
        shutil.rmtree(staging, ignore_errors=True)
        return {n: result(n, detail=f"caches not kept: {err}") for n in paths}
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    kept = {"ok": True, "detail": "", "folder": str(dest), "manifest": manifest, "files": len(manifest),
            "bytes": sum((dest / rel).stat().st_size for rel in manifest)}
    if len(paths) == 1:  # one problem: the job's whole time, start-up included
        kept["seconds"] = round(time.monotonic() - start, 3)
    return {n: failed.get(n) or result(n, **kept) for n in paths}


@dataclass
class Seed:
    """A warmed cache folder and its manifest, planted into a job's scratch folder by
    :func:`kforge.verifier.runner.run_job` (``seed=``). ``status`` says what happened:
    ``hit: N files``, or why the job compiles from nothing."""

    folder: Path
    manifest: dict[str, str]
    status: str = field(default="not planted")

    def __call__(self, scratch: Path) -> None:
        try:
            for name in CACHE_DIRS:
                if (self.folder / name).is_dir():
                    shutil.copytree(self.folder / name, scratch / name, symlinks=True)
            # checked on the copies the worker will read, after copying: nothing can change
            # them in between (the worker, the only other process that sees them, starts later)
            found = manifest_of(scratch)
            if found != self.manifest:
                changed = sorted(p for p in found.keys() | self.manifest.keys() if found.get(p) != self.manifest.get(p))
                raise ValueError(f"{len(changed)} files differ from the manifest, e.g. {changed[0]}")
            self.status = f"hit: {len(found)} files"
        except (OSError, ValueError) as err:
            for name in CACHE_DIRS:
                shutil.rmtree(scratch / name, ignore_errors=True)
            self.status = f"cold: the warmed cache was not used ({err})"[:300]


def seed_from_record(record: dict[str, Any] | None) -> Seed | None:
    """The :class:`Seed` of a :func:`warm` result, None when it did not warm anything."""
    if not record or not record.get("ok") or not record.get("folder"):
        return None
    return Seed(Path(record["folder"]), dict(record.get("manifest") or {}))
