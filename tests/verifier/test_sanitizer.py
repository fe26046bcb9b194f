"""compute-sanitizer support on the CPU: parsing its output, judging a run, the unavailable path,
the sandboxed wrapper (with a stand-in for the tool), the config field and the verify stage."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from kforge.config import ConfigError, parse_config
from kforge.schema import Verdict
from kforge.stages.context import StageContext, write_record
from kforge.stages.records import CompileRecord
from kforge.stages.verify import run_verify
from kforge.store import Store, sha256_bytes
from kforge.verifier.protocol import Frame
from kforge.verifier.runner import JobOutcome
from kforge.verifier.sanitizer import (
    LOG_NAME,
    SanitizerReport,
    judge_run,
    parse_sanitizer_output,
    run_sanitizer,
    sanitize_candidate,
)

from .conftest import FIXTURES, HONEST, SCALE_TANH, assert_nothing_left

MEMCHECK = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at l2_normalize_rows(const float *, float *, long, float)+0x4b0 in /tmp/kforge-run-x1/cuda_ext/kf_cuda_0123/cuda.cu:41
=========     by thread (0,0,0) in block (255,0,0)
=========     Address 0x7f3a5c0fa000 is out of bounds
=========     and is 0 bytes after the nearest allocation at 0x7f3a5c000000 of size 1024000 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2dbf8f] in /usr/lib/x86_64-linux-gnu/libcuda.so.1
=========         Host Frame: launch_l2_normalize_rows [0x1a2b] in /root/.cache/kforge/cuda_ext/kf_cuda_0123.so
=========
========= Invalid __global__ write of size 4 bytes
=========     at l2_normalize_rows(const float *, float *, long, float)+0x4b0 in /tmp/kforge-run-x1/cuda_ext/kf_cuda_0123/cuda.cu:41
=========     by thread (32,0,0) in block (255,0,0)
=========     Address 0x7f3a5c0fa080 is out of bounds
=========     and is 128 bytes after the nearest allocation at 0x7f3a5c000000 of size 1024000 bytes
=========
========= ERROR SUMMARY: 2 errors
"""

RACECHECK = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at l2_normalize_rows(const float *, float *, long, float)+0x1d0 in /build/cuda.cu:31
=========     and Read access at l2_normalize_rows(const float *, float *, long, float)+0x210 in /build/cuda.cu:34 [1792 hazards]
=========
========= Warning: Race reported between Read access at l2_normalize_rows(const float *, float *, long, float)+0x210 in /build/cuda.cu:34
=========     and Write access at l2_normalize_rows(const float *, float *, long, float)+0x1d0 in /build/cuda.cu:31 [24 hazards]
=========
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""

CLEAN = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
CLEAN_RACE = "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"


# ------------------------------------------------------------------------------- parsing


def test_memcheck_block_is_one_finding_with_its_kernel_and_no_paths() -> None:
    parsed = parse_sanitizer_output(MEMCHECK)
    assert parsed.summary and parsed.errors == 2 and parsed.warnings == 0
    # two threads, two addresses, one finding: same access at the same place
    assert parsed.findings == [
        "Invalid __global__ write of size 4 bytes at "
        "l2_normalize_rows(const float *, float *, long, float)+0x4b0 in cuda.cu:41"
    ]
    text = "\n".join(parsed.findings)
    assert "/tmp" not in text and "kforge-run" not in text and "Host Frame" not in text


def test_racecheck_hazards_keep_both_sides_and_count_errors_and_warnings() -> None:
    parsed = parse_sanitizer_output(RACECHECK)
    assert parsed.summary and (parsed.errors, parsed.warnings) == (1, 1)
    assert len(parsed.findings) == 2
    first = parsed.findings[0]
    assert first.startswith("Error: Race reported between Write access at l2_normalize_rows")
    assert "and Read access at" in first and "[1792 hazards]" in first and "cuda.cu:34" in first
    assert parsed.findings[1].startswith("Warning: Race reported between Read access")
    assert "/build" not in "\n".join(parsed.findings)


def test_clean_summaries_and_older_spellings() -> None:
    for text in (CLEAN, CLEAN_RACE):
        parsed = parse_sanitizer_output(text)
        assert parsed.summary and parsed.errors == 0 and parsed.warnings == 0 and parsed.findings == []
    one = parse_sanitizer_output("========= ERROR SUMMARY: 1 error\n")
    assert one.errors == 1
    old = parse_sanitizer_output(  # cuda-memcheck era: upper-case severity, flush continuation
        "========= ERROR: Race reported between Write access at 0x60 in race.cu:8:k(int*)\n"
        "========= and Read access at 0xa0 in race.cu:10:k(int*) [248 hazards]\n"
        "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")
    assert old.errors == 1 and len(old.findings) == 1 and "and Read access" in old.findings[0]
    assert parse_sanitizer_output("no sanitizer here\n").summary is False


def test_findings_are_capped_and_distinct() -> None:
    blocks = "".join(f"========= Invalid __global__ read of size 4 bytes\n=========     at k{i}()+0x10 in a.cu:{i}\n========= \n"
                     for i in range(30))
    parsed = parse_sanitizer_output(blocks + "========= ERROR SUMMARY: 30 errors\n")
    assert parsed.errors == 30 and len(parsed.findings) == 10
    assert len(set(parsed.findings)) == 10


# ------------------------------------------------------------------------------- judging


def _outcome(log: str, returncode: int | None = 0, reason: Any = None, case: dict[str, Any] | None = None,
             streams: str = "") -> JobOutcome:
    frames = [] if case is None else [Frame({"kind": "case", "index": 0, **case}, []), Frame({"kind": "done"}, [])]
    return JobOutcome(frames, reason, "worker detail", "test", 1.0, returncode=returncode,
                      files={LOG_NAME: log}, streams=streams)


def test_judge_findings_fail_with_the_tools_reason() -> None:
    r = judge_run("memcheck", _outcome(MEMCHECK, returncode=86, case={}))
    assert not r.ok and r.available and r.reason == "sanitizer_memcheck" and r.errors == 2
    assert "Invalid __global__ write" in r.detail and r.exit_code == 86
    race = judge_run("racecheck", _outcome(RACECHECK, returncode=86, case={}))
    assert not race.ok and race.reason == "sanitizer_racecheck" and "1 error, 1 warning" in race.detail


def test_judge_exit_code_outweighs_a_log_the_candidate_emptied() -> None:
    r = judge_run("memcheck", _outcome("", returncode=86, case={}))
    assert not r.ok and r.reason == "sanitizer_memcheck" and r.errors >= 1


def test_judge_memcheck_finding_wins_over_the_device_error_it_caused() -> None:
    from kforge.verifier.reasons import Reason

    r = judge_run("memcheck", _outcome(MEMCHECK, returncode=86, reason=Reason.DEVICE_ERROR))
    assert r.reason == "sanitizer_memcheck"


def test_judge_clean_run_is_ok_only_when_modelnew_ran() -> None:
    assert judge_run("memcheck", _outcome(CLEAN, case={})).ok
    assert judge_run("racecheck", _outcome(CLEAN_RACE, case={})).ok
    failed_case = judge_run("memcheck", _outcome(CLEAN, case={"error": "RuntimeError: boom"}))
    assert not failed_case.ok and failed_case.reason == "crashed" and "boom" in failed_case.detail
    no_case = judge_run("memcheck", _outcome(CLEAN))
    assert not no_case.ok and no_case.reason == "crashed"


def test_judge_unfinished_runs_are_not_findings() -> None:
    from kforge.verifier.reasons import Reason

    timed_out = judge_run("memcheck", _outcome("========= COMPUTE-SANITIZER\n", returncode=-9, reason=Reason.TIMEOUT))
    assert not timed_out.ok and timed_out.reason == "timeout" and timed_out.errors == 0
    silent = judge_run("memcheck", _outcome("", returncode=1, case={}, streams="compute-sanitizer: bad option\n"))
    assert not silent.ok and silent.reason == "harness_error" and "bad option" in silent.detail


def test_judge_reads_the_streams_when_the_log_is_missing() -> None:
    r = judge_run("memcheck", _outcome("", returncode=86, case={}, streams="out\n" + MEMCHECK))
    assert r.reason == "sanitizer_memcheck" and r.errors == 2 and len(r.findings) == 1


# ------------------------------------------------------------------------------- unavailable


def test_unavailable_here_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    cpu = sanitize_candidate(HONEST, SCALE_TANH, platform="cpu", build_dir=tmp_path)
    assert not cpu.available and not cpu.ok and cpu.reason == "no_device" and "cuda" in cpu.detail.lower()
    cuda = sanitize_candidate(HONEST, SCALE_TANH, platform="cuda", tool="racecheck", build_dir=tmp_path)
    assert not cuda.available and not cuda.ok and cuda.reason == "no_device" and cuda.detail
    unknown = sanitize_candidate(HONEST, SCALE_TANH, platform="no-such-platform")
    assert not unknown.available and unknown.reason == "harness_error"
    with pytest.raises(ValueError, match="asan"):  # the caller's mistake, said at once
        sanitize_candidate(HONEST, SCALE_TANH, platform="cuda", tool="asan")  # type: ignore[arg-type]
    assert_nothing_left()
    assert_nothing_left("compute-sanitizer")


# ------------------------------------------------------------------------------- the wrapper, sandboxed

STUB = r"""#!/bin/sh
# Stand-in for compute-sanitizer: takes its options, runs the target, writes a canned log.
log=""; code=1; tool=""
while [ $# -gt 0 ]; do
  case "$1" in
    --log-file) log="$2"; shift 2 ;;
    --error-exitcode) code="$2"; shift 2 ;;
    --tool) tool="$2"; shift 2 ;;
    --*) shift 2 ;;
    *) break ;;
  esac
done
"$@"
rc=$?
{
  echo "========= COMPUTE-SANITIZER"
  if [ "@FINDING@" = yes ]; then
    echo "========= Invalid __global__ write of size 4 bytes (tool $tool, caching $PYTORCH_NO_CUDA_MEMORY_CACHING)"
    echo "=========     at k()+0x10 in $PWD/x.cu:3"
    echo "========= ERROR SUMMARY: 1 error"
  else
    echo "========= ERROR SUMMARY: 0 errors"
  fi
} > "$log"
if [ "@FINDING@" = yes ]; then exit "$code"; fi
exit "$rc"
"""

# Fails if torch.profiler is active around the call: sanitized runs must keep CUPTI out.
NO_PROFILER = HONEST.replace("    def forward(self, x):\n", "    def forward(self, x):\n"
                             "        if torch.autograd._profiler_enabled():\n"
                             "            raise RuntimeError('profiler active under the sanitizer')\n")


def _stub(tmp_path: Path, finding: bool) -> str:
    folder = tmp_path / "fake-cuda" / "bin"
    folder.mkdir(parents=True)
    exe = folder / "compute-sanitizer-stub-kf"
    exe.write_text(STUB.replace("@FINDING@", "yes" if finding else "no"))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(exe)


def _run_stub(tmp_path: Path, source: str, finding: bool) -> SanitizerReport:
    assert NO_PROFILER != HONEST
    return run_sanitizer(source, SCALE_TANH, exe=_stub(tmp_path, finding), tool="memcheck", device="cpu",
                         env={}, preset="ci", sizes=None, build_dir=tmp_path, timeout_s=120)


def test_sandboxed_wrapper_clean_run_runs_modelnew_without_profiler(tmp_path: Path) -> None:
    r = _run_stub(tmp_path, NO_PROFILER, finding=False)
    assert r.available and r.ok, r
    assert r.reason is None and r.errors == 0 and r.exit_code == 0
    assert_nothing_left()
    assert_nothing_left("compute-sanitizer-stub-kf", unique=True)


def test_sandboxed_wrapper_finding_comes_back_from_the_scratch_log(tmp_path: Path) -> None:
    r = _run_stub(tmp_path, HONEST, finding=True)
    assert not r.ok and r.reason == "sanitizer_memcheck" and r.errors == 1 and r.exit_code == 86
    assert r.findings == ["Invalid __global__ write of size 4 bytes (tool memcheck, caching 1) at k()+0x10 in x.cu:3"]
    assert_nothing_left()


def test_sandboxed_wrapper_candidate_that_raises_is_not_clean(tmp_path: Path) -> None:
    broken = HONEST.replace("            z = x * 2.0 + 1.0\n", "            raise ValueError('nope')\n")
    assert broken != HONEST
    r = _run_stub(tmp_path, broken, finding=False)
    assert not r.ok and r.reason == "crashed" and "nope" in r.detail


# ------------------------------------------------------------------------------- config


def _config(tmp_path: Path, **verify: Any) -> dict[str, Any]:
    return {
        "store": str(tmp_path / "artifacts"),
        "agents": {"expert": {"kind": "expert"}},
        "suites": {"fx": {"path": str(FIXTURES), "include": ["scale_tanh"]}},
        "run": {"agents": ["expert"], "platforms": ["cpu"], "suites": ["fx"]},
        "verify": {"trials": 1, "timeout_s": 60, **verify},
    }


def test_config_sanitizer_field(tmp_path: Path) -> None:
    assert parse_config(_config(tmp_path)).verify.sanitizer == []
    both = parse_config(_config(tmp_path, sanitizer=["memcheck", "racecheck"]))
    assert both.verify.sanitizer == ["memcheck", "racecheck"]
    with pytest.raises(ConfigError, match="verify.sanitizer"):
        parse_config(_config(tmp_path, sanitizer=["asan"]))
    with pytest.raises(ConfigError, match="once"):
        parse_config(_config(tmp_path, sanitizer=["memcheck", "memcheck"]))
    with pytest.raises(ConfigError, match="verify.sanitizer"):
        parse_config(_config(tmp_path, sanitizer="memcheck"))


# ------------------------------------------------------------------------------- verify stage


def _stage(tmp_path: Path, store: Path | None = None, **verify: Any) -> tuple[StageContext, dict[str, Any]]:
    data = _config(tmp_path, **verify)
    if store is not None:
        data["store"] = str(store)
    config = parse_config(data)
    ctx = StageContext(config=config, store=Store(config.store))
    kernel = tmp_path / "kernel.py"
    kernel.write_text(HONEST)
    compile_record = tmp_path / "compile.json"
    write_record(compile_record, CompileRecord(platform="cpu", source=sha256_bytes(HONEST.encode()), ok=True,
                                               reason="ok", log=None, seconds=0.0), ctx.store)
    args = {"platform": "cpu", "suite": "fx", "problem": "scale_tanh", "kernel": kernel,
            "compile_record": compile_record, "out": tmp_path / "verify.json"}
    return ctx, args


def _ledger(ctx: StageContext) -> list[str]:
    path = ctx.root / "ledger.jsonl"
    return path.read_text().splitlines() if path.is_file() else []


def test_stage_leaves_verdicts_untouched_when_the_list_is_empty_or_the_device_is_not_cuda(tmp_path: Path) -> None:
    ctx, args = _stage(tmp_path)
    record = run_verify(ctx, **args)
    assert record.verdict.ok, record.verdict
    assert record.verdict.reason == "ok" and record.sanitizer == []
    assert len(_ledger(ctx)) == 1
    # the setting is part of the action key: the same candidate is verified again, not served
    # from the cache; on a CPU platform no sanitizer runs and the verdict stays as it was
    ctx2, args2 = _stage(tmp_path, store=ctx.root, sanitizer=["memcheck"])
    again = run_verify(ctx2, **args2)
    assert len(_ledger(ctx2)) == 2
    assert again.verdict.ok and again.verdict.reason == "ok" and again.sanitizer == []
    assert_nothing_left()


def _fake_verify(monkeypatch: pytest.MonkeyPatch, calls: list[str], reports: dict[str, SanitizerReport]) -> None:
    import kforge.verifier
    import kforge.verifier.sanitizer as sanitizer

    def verify_candidate(source: str, problem_path: Path, **kw: Any) -> Verdict:
        return Verdict(ok=True, reason="ok", policy=kw["policy"], atol=1e-4, rtol=1e-4, device="cuda")

    def sanitize_candidate(source: str, problem_path: Path, *, tool: str, **kw: Any) -> SanitizerReport:
        calls.append(tool)
        return reports[tool]

    monkeypatch.setattr(kforge.verifier, "verify_candidate", verify_candidate)
    monkeypatch.setattr(sanitizer, "sanitize_candidate", sanitize_candidate)


def test_stage_finding_fails_the_verdict_as_repair_feedback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    finding = "Invalid __global__ write of size 4 bytes at k()+0x10 in cuda.cu:3"
    calls: list[str] = []
    _fake_verify(monkeypatch, calls, {
        "memcheck": SanitizerReport(tool="memcheck", available=True, ok=False, errors=1, findings=[finding],
                                    reason="sanitizer_memcheck", detail=f"compute-sanitizer --tool memcheck: 1 error\n- {finding}"),
        "racecheck": SanitizerReport(tool="racecheck", available=True, ok=True),
    })
    ctx, args = _stage(tmp_path, sanitizer=["memcheck", "racecheck"])
    record = run_verify(ctx, **args)
    assert not record.verdict.ok and record.verdict.reason == "sanitizer_memcheck"
    assert finding in record.verdict.detail
    assert calls == ["memcheck"]  # the first finding settles it
    assert [r["tool"] for r in record.sanitizer] == ["memcheck"] and record.sanitizer[0]["errors"] == 1
    # what the next (repair) round's generation request carries
    from kforge.stages.refine import _feedback

    compiled = CompileRecord.model_validate_json(args["compile_record"].read_bytes())
    (fb,) = _feedback(ctx, compiled, record, "")
    assert fb.stage == "verify" and fb.reason == "sanitizer_memcheck" and finding in fb.detail


def test_stage_clean_or_unavailable_sanitizer_keeps_the_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    _fake_verify(monkeypatch, calls, {
        "memcheck": SanitizerReport(tool="memcheck", available=True, ok=True),
        "racecheck": SanitizerReport(tool="racecheck", available=False, ok=False, reason="no_device",
                                     detail="compute-sanitizer not found"),
    })
    ctx, args = _stage(tmp_path, sanitizer=["memcheck", "racecheck"])
    record = run_verify(ctx, **args)
    assert record.verdict.ok and record.verdict.reason == "ok"
    assert calls == ["memcheck", "racecheck"]
    assert [(r["tool"], r["ok"], r["available"]) for r in record.sanitizer] == [
        ("memcheck", True, True), ("racecheck", False, False)]
