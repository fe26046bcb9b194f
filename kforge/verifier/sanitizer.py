"""compute-sanitizer over one candidate run: out-of-bounds accesses (memcheck) and shared-memory
races (racecheck) that outputs within tolerance do not reveal.

The candidate runs in the usual sandboxed worker (``candidate`` mode, one native case, no
profiler: ``"sanitize": true``), wrapped inside the sandbox as::

    compute-sanitizer --tool T --error-exitcode 86 --print-limit 20 --report-api-errors no \\
        --target-processes all --log-file <scratch>/sanitizer.log python -m kforge.verifier.worker_main

with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (memcheck sees an out-of-bounds write in a PyTorch
program only when every tensor is its own cudaMalloc). The verdict rests on the sanitizer's
exit code (86: errors found; a candidate cannot lower it) and on the summary line of the log
(``ERROR SUMMARY: N errors``; racecheck: ``RACECHECK SUMMARY: H hazards displayed (E errors,
W warnings)``); the log's first distinct findings, scrubbed of paths, are the detail the
generation agent sees. The log lies in the candidate's scratch folder: a candidate could add to
it, which only hurts itself; the exit code is what it cannot forge.

Host API errors are not reported (``--report-api-errors no``): PyTorch's own probing calls
would count, and a candidate's failed launch already fails verification.

Without ``compute-sanitizer`` (PATH, ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``) or without a
CUDA device the report says ``available=False`` and why; nothing here raises for anything the
candidate does.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from kforge.schema import Verdict
from kforge.verifier.inputs import plan_cases
from kforge.verifier.reasons import Reason
from kforge.verifier.runner import JobOutcome, build_folder, run_job, scrub
from kforge.verifier.sandbox import Limits

Tool = Literal["memcheck", "racecheck"]
TOOLS: tuple[Tool, ...] = ("memcheck", "racecheck")
ERROR_EXITCODE = 86
PRINT_LIMIT = 20
MAX_FINDINGS = 10
LOG_NAME = "sanitizer.log"
REASONS: dict[str, Reason] = {"memcheck": Reason.SANITIZER_MEMCHECK, "racecheck": Reason.SANITIZER_RACECHECK}
FINDING_REASONS = frozenset(r.value for r in REASONS.values())

_PREFIX = re.compile(r"^=========(?P<indent>\s*)(?P<msg>.*?)\s*$")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?")
_RACE_SUMMARY = re.compile(
    r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)")
_BASENAME = re.compile(r"(?<![\w.<])/(?:[\w.+-]+/)+([\w.+-]+)")
# Lines that continue a finding (indented in real output; some documents print them flush).
_CONTINUATION = ("at ", "and ", "by thread", "address ", "access at", "saved host backtrace",
                 "host frame", "device frame", "current value", "write thread", "read thread")
# Top-level lines that are not findings of the candidate's kernels.
_NOISE = ("COMPUTE-SANITIZER", "Target application returned an error", "Process didn't terminate",
          "Error: No attachable process", "Default timeout can be adjusted")


class SanitizerReport(BaseModel):
    """One compute-sanitizer tool over one candidate run (stored in the verify record)."""

    tool: Tool
    available: bool
    ok: bool
    errors: int = 0  # error-level findings (the summary, else the exit code, else the findings)
    warnings: int = 0  # racecheck's warning-level hazards (they fail the run too)
    findings: list[str] = Field(default_factory=list)  # first distinct finding lines, scrubbed
    reason: str | None = None  # a Reason value; None when the run was clean
    detail: str = ""
    exit_code: int | None = None
    sandbox: str = ""
    seconds: float = 0.0


@dataclass
class ParsedOutput:
    errors: int = 0
    warnings: int = 0
    summary: bool = False  # the tool printed its summary line (it finished)
    findings: list[str] = field(default_factory=list)


def parse_sanitizer_output(text: str, *, limit: int = MAX_FINDINGS) -> ParsedOutput:
    """Counts and the first ``limit`` distinct findings of compute-sanitizer's text output.

    A finding is a top-level ``========= `` line (``Invalid __global__ write of size 4 bytes``,
    ``Error: Race reported between Write access at ...``) joined with its first ``at``/``and``
    line, so the kernel and the other side of a race come along. Paths are scrubbed; findings
    that differ only in addresses, threads or blocks count once."""
    parsed = ParsedOutput()
    seen: set[str] = set()
    current: list[str] | None = None  # [header, first location] of the finding being read

    def flush() -> None:
        if current is None or len(parsed.findings) >= limit:
            return
        # A file's own name (cuda.cu:40) helps a repair; the folders it lies in are scrubbed.
        line = scrub(_BASENAME.sub(r"\1", " ".join(current)), None)
        key = re.sub(r"0x[0-9a-fA-F]+|\(\d+,\d+,\d+\)|\[\d+ hazards?\]|\d+ bytes? (after|before)", "#", line)
        if key not in seen:
            seen.add(key)
            parsed.findings.append(line)

    for raw in text.splitlines():
        if (m := _ERROR_SUMMARY.search(raw)) is not None:
            parsed.errors = max(parsed.errors, int(m.group(1)))
            parsed.summary = True
            continue
        if (m := _RACE_SUMMARY.search(raw)) is not None:
            parsed.errors = max(parsed.errors, int(m.group(2)))
            parsed.warnings = max(parsed.warnings, int(m.group(3)))
            parsed.summary = True
            continue
        m = _PREFIX.match(raw)
        if m is None:
            continue
        msg = m.group("msg")
        if not msg:
            flush()
            current = None
            continue
        lowered = msg.lower()
        if len(m.group("indent")) > 1 or lowered.startswith(_CONTINUATION):
            if current is not None and len(current) == 1 and lowered.startswith(("at ", "and ")):
                current.append(msg)
            continue
        flush()
        current = None if msg.startswith(_NOISE) or "SUMMARY:" in msg else [msg]
    flush()
    return parsed


def find_sanitizer() -> str | None:
    """``compute-sanitizer`` on the PATH, else under ``$CUDA_HOME/bin`` or /usr/local/cuda/bin."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for home in homes:
        if home:
            exe = Path(home) / "bin" / "compute-sanitizer"
            if exe.is_file() and os.access(exe, os.X_OK):
                return str(exe)
    return None


def sanitizer_argv(exe: str, tool: Tool, log: Path) -> list[str]:
    return [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXITCODE), "--print-limit", str(PRINT_LIMIT),
            "--report-api-errors", "no", "--target-processes", "all", "--log-file", str(log)]


def sanitize_candidate(
    source: str, problem_path: Path, *, platform: str, tool: Tool = "memcheck", preset: str = "ci",
    sizes: dict[str, int] | None = None, build_dir: Path | None = None, timeout_s: float = 300.0,
) -> SanitizerReport:
    """Run the candidate once under ``compute-sanitizer --tool tool``; never raises for anything
    the candidate does (only for a ``tool`` other than memcheck/racecheck), and reports
    ``available=False`` where the tool or the device is missing."""
    start = time.monotonic()

    def unavailable(reason: Reason, detail: str) -> SanitizerReport:
        return SanitizerReport(tool=tool, available=False, ok=False, reason=reason.value, detail=detail,
                               seconds=time.monotonic() - start)

    if tool not in TOOLS:  # a caller's mistake, not the candidate's
        raise ValueError(f"unknown compute-sanitizer tool {tool!r}; have {', '.join(TOOLS)}")
    from kforge.platforms import UnknownPlatformError, get_platform

    try:
        plat = get_platform(platform)
        device = plat.device()
    except (UnknownPlatformError, ImportError) as err:
        return unavailable(Reason.HARNESS_ERROR, str(err))
    if device != "cuda":
        return unavailable(Reason.NO_DEVICE, f"platform {platform} runs on {device}: compute-sanitizer checks CUDA devices only")
    exe = find_sanitizer()
    if exe is None:
        return unavailable(Reason.NO_DEVICE, "compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    try:
        info = plat.describe()
    except Exception as err:  # noqa: BLE001 - a broken platform probe is our problem, not the candidate's
        return unavailable(Reason.HARNESS_ERROR, f"{type(err).__name__}: {err}")
    if not info.runnable:
        return unavailable(Reason.NO_DEVICE, f"platform {platform} cannot run here: {info.reason}")
    build = build_folder(platform, build_dir)
    report = run_sanitizer(source, Path(problem_path), exe=exe, tool=tool, device=device, env=plat.worker_env(build),
                           preset=preset, sizes=sizes, build_dir=build, timeout_s=timeout_s)
    report.seconds = time.monotonic() - start
    return report


def run_sanitizer(
    source: str, problem_path: Path, *, exe: str, tool: Tool, device: str, env: dict[str, str],
    preset: str, sizes: dict[str, int] | None, build_dir: Path, timeout_s: float,
) -> SanitizerReport:
    """The sanitized worker run and its judgement, for any ``exe`` taking compute-sanitizer's
    arguments (the CPU tests pass a stand-in script and ``device="cpu"``)."""
    from kforge.verifier.verify import MODEL_SEED

    problem_path = problem_path.resolve()
    case = plan_cases(1, None)[0].to_json()  # one case, native distribution
    job = {"mode": "candidate", "sanitize": True, "problem_path": str(problem_path), "preset": preset,
           "sizes": sizes, "cases": [case], "device": device, "model_seed": MODEL_SEED}
    env = {**env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}  # every tensor its own cudaMalloc
    out = run_job(job, scratch_root=None, env_extra=env,
                  limits=Limits(timeout_s=timeout_s, memory_mb=None, max_pids=512), gpu=device == "cuda",
                  candidate_source=source, ro_paths=[build_dir, problem_path.parent, Path(exe).resolve().parent],
                  argv_prefix=lambda scratch: sanitizer_argv(exe, tool, scratch / LOG_NAME), collect=[LOG_NAME])
    return judge_run(tool, out)


def judge_run(tool: Tool, out: JobOutcome) -> SanitizerReport:
    """Turn a sanitized run (exit code, log, worker frames) into a report."""
    log = out.files.get(LOG_NAME, "")
    text = log if "=========" in log else out.streams
    parsed = parse_sanitizer_output(text)
    errors, warnings = parsed.errors, parsed.warnings
    if out.returncode == ERROR_EXITCODE and errors + warnings == 0:
        errors = max(1, len(parsed.findings))  # the exit code says so, whatever the log holds
    if not parsed.summary and errors + warnings == 0 and parsed.findings:
        errors = len(parsed.findings)  # cut short (timeout) after reporting

    def report(ok: bool, reason: str | None, detail: str = "") -> SanitizerReport:
        return SanitizerReport(tool=tool, available=True, ok=ok, errors=errors, warnings=warnings,
                               findings=parsed.findings, reason=reason, detail=detail[:2000],
                               exit_code=out.returncode, sandbox=out.mode)

    if errors or warnings:
        counts = f"{errors} error{'s' if errors != 1 else ''}"
        if tool == "racecheck":
            counts += f", {warnings} warning{'s' if warnings != 1 else ''}"
        listed = "\n".join(f"- {f}" for f in parsed.findings) or "- (no finding lines in the log)"
        return report(False, REASONS[tool].value, f"compute-sanitizer --tool {tool}: {counts}\n{listed}")
    cases = [f.header for f in out.frames if f.header.get("kind") == "case"]
    if out.reason is not None:
        why = "" if parsed.summary else " (no sanitizer summary: the run did not finish)"
        return report(False, out.reason.value, f"{out.detail}{why}")
    if not parsed.summary:
        tail = scrub(text[-600:], None)
        return report(False, Reason.HARNESS_ERROR.value,
                      f"compute-sanitizer printed no summary (exit {out.returncode}): {tail}")
    if not cases or any("error" in c for c in cases):
        error = next((str(c["error"]) for c in cases if "error" in c), "no case was run")
        return report(False, Reason.CRASHED.value, f"ModelNew did not run under the sanitizer: {error}")
    return report(True, None)


def apply_sanitizers(
    verdict: Verdict, source: str, problem_path: Path, *, platform: str, tools: list[Tool] | tuple[Tool, ...],
    preset: str = "ci", sizes: dict[str, int] | None = None, build_dir: Path | None = None,
    timeout_s: float = 300.0,
) -> tuple[Verdict, list[SanitizerReport]]:
    """Run ``tools`` in order on a passing CUDA verdict; the first finding turns it into a
    failure with that tool's reason and the findings as detail (repair feedback). Runs that
    could not finish (no tool, timeout, crash) are recorded and leave the verdict as it was."""
    if not verdict.ok or verdict.device != "cuda" or not tools:
        return verdict, []
    reports: list[SanitizerReport] = []
    for tool in tools:
        report = sanitize_candidate(source, problem_path, platform=platform, tool=tool, preset=preset,
                                    sizes=sizes, build_dir=build_dir, timeout_s=timeout_s)
        reports.append(report)
        if report.reason is not None and report.reason in FINDING_REASONS:
            verdict = verdict.model_copy(update={"ok": False, "reason": report.reason,
                                                 "detail": report.detail[:2000]})
            break
    return verdict, reports
