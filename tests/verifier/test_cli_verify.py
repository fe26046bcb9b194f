"""``kforge verify`` on a user's mistakes: a one-line error and an exit code of its own, never a
traceback (preflight.py); the build runs first and its errors are printed as such. Also the
sandbox under a virtual environment in /tmp, and the one harness module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.verifier.cli import main

from . import cpu_offenders as off
from .conftest import REPO, SCALE_TANH, honest_with, verify


def _run(tmp_path: Path, source: str, *extra: str, problem: Path = off.PROBLEM) -> int:
    cand = tmp_path / "cand.py"
    cand.write_text(source)
    return main([str(cand), "--problem", str(problem), "--build-dir", str(tmp_path / "build"), *extra])


def test_user_mistakes_have_their_own_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (3, lambda: main([str(tmp_path / "nope.py"), "--problem", str(off.PROBLEM)]), "candidate file not found"),
        (3, lambda: _run(tmp_path, off.HONEST, problem=tmp_path / "none.py"), "problem file not found"),
        (4, lambda: _run(tmp_path, off.HONEST.replace("class ModelNew", "class Other")), "no top-level class ModelNew"),
        (5, lambda: _run(tmp_path, off.HONEST.replace("def forward(self, x):", "def forward(self, x, y):")),
         "ModelNew.forward takes 2"),
        (5, lambda: _run(tmp_path, off.HONEST.replace("def __init__(self, dim: int):", "def __init__(self):")),
         "ModelNew.__init__ takes 0"),
        (6, lambda: _run(tmp_path, off.HONEST, "--platform", "fpga"), "unknown platform 'fpga'"),
    ]
    for code, call, text in cases:
        got = call()
        err = capsys.readouterr().err
        assert got == code and text in err and "Traceback" not in err, (code, got, err)
        assert len(err.strip().splitlines()) == 1, err
    bad_problem = tmp_path / "p.py"
    bad_problem.write_text("x = 1\n")
    assert _run(tmp_path, off.HONEST, problem=bad_problem) == 8
    assert "no top-level class Model" in capsys.readouterr().err


def test_build_errors_are_printed_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = off.HONEST.replace("float v = xr[c] + bias[c];", "float v = xr[c] + undeclared_thing;")
    assert _run(tmp_path, broken) == 1
    err = capsys.readouterr().err
    assert "undeclared_thing" in err and "build failed on platform cpu" in err and "Traceback" not in err
    assert _run(tmp_path, honest_with("        return y"), problem=SCALE_TANH) == 1  # no CPP_SOURCE
    assert "CPP_SOURCE" in capsys.readouterr().err


def test_the_guard_watches_the_live_harness_functions() -> None:
    # The candidate wraps the live channel's ``send`` (the module whose RESULT_FD is open) to
    # hide that it writes its input. With the worker run as ``python -m kforge.verifier.worker``
    # the live module was ``__main__`` and the guard watched an idle copy: it saw nothing (the
    # verdict came from elsewhere, mutates_input). Now there is one harness module, watched.
    forge = honest_with("        x.add_(1.0)\n        return y", header="""
import sys
_live = [m for m in list(sys.modules.values())
         if type(getattr(m, "RESULT_FD", None)) is int and m.RESULT_FD >= 0 and hasattr(m, "send")]
for _m in _live:
    def _forged(header, blobs=None, _o=_m.send):
        if header.get("kind") == "case" and "digest" in header:
            header = dict(header, digest_after=header["digest"])
        return _o(header, blobs)
    _m.send = _forged
""")
    v = verify(forge, static=False)
    assert v.reason == "harness_tampering" and "worker.send" in v.detail, (v.reason, v.detail)


def test_sandbox_runs_an_interpreter_from_a_venv_under_tmp(tmp_path_factory: pytest.TempPathFactory) -> None:
    venv = Path("/tmp") / f"kforge-venv-{os.getpid()}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    try:
        code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.verifier.conftest import HONEST, SCALE_TANH; "
                "from kforge.verifier.verify import run_verification as r; "
                "v = r(HONEST, SCALE_TANH, platform='cpu', policy='strict', timeout_s=60); print(v.reason, v.sandbox, v.detail[:300])")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, env=env,
                             timeout=300)
        assert out.stdout.startswith("ok "), out.stdout + out.stderr[-2000:]
    finally:
        subprocess.run(["rm", "-rf", str(venv)], check=False)


def test_bench_times_the_honest_control_and_rejects_an_offender(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from kforge.verifier.cli import bench_main

    cand = tmp_path / "cand.py"
    common = ["--problem", str(off.PROBLEM), "--build-dir", str(tmp_path / "build"), "--json", "--threads", "1"]
    cand.write_text(off.STALE_AFTER_N)
    assert bench_main([str(cand), *common]) == 1  # verification's repeat phase rejects it
    rejected = json.loads(capsys.readouterr().out)
    assert rejected["reason"] == "stale_output" and "repeat phase" in rejected["detail"], rejected
    cand.write_text(off.HONEST)
    assert bench_main([str(cand), *common, "--reps", "10", "--eager-only"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["verified"] and got["reason"] == "ok" and got["clock"].startswith("parent handshake"), got
    assert got["checked"].startswith("checked: ") and got["candidate"]["median_ms"] > 0 and got["speedup_vs_eager"], got
    assert got["status"] in {"shipped", "no_gain"}, got
    assert got["compiled"] is None and got["compile_baseline"] is False, got  # --eager-only
