"""Issues 15 and 30 through the whole pipeline: an LLM agent (a local OpenAI-compatible server)
answers with a candidate that launches a real C++ kernel and cheats only where nobody looked
before (stale after a few calls, a cache keyed on the input, a partial recompute, a write after
return, a forged clock; a global hook, a patched verifier, the reference cache read from disk,
a cache keyed on sampled elements, numpy doing the work), and the run must reject each with its
reason code; an honest control must verify and be timed.

One problem (refs/cpu's bias + ReLU), one round, one agent per candidate (the server answers
by model name), select timing eager alone (the baselines are tests/test_pipeline.py's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kforge.verifier.verify import reference_cache_dir
from tests.pipeline_helpers import REPO, snakemake, write_config
from tests.verifier import cpu_offenders as off

from .server import Received, Reply, ScriptedServer, ok

pytestmark = pytest.mark.slow

CANDIDATES = {
    "honest": off.HONEST,
    "stale": off.STALE_AFTER_N,  # right for a few calls, then the last output again
    "cache": off.CACHE_BY_KEY,  # output cached by the input's pointer / shape / version
    "partial": off.PARTIAL_ON_REPEAT,  # recomputes half the rows on a repeated input
    "late": off.WRITES_AFTER_RETURN,  # a C++ thread writes the output after forward returned
    "forge": off.FORGED_CLOCK_CANDIDATE_ONLY,  # replaces the timing clock from inside the worker
    # issue 30's classes
    "hook": off.GLOBAL_HOOK,  # a global forward pre-hook that slows every other module
    "patch": off.HARNESS_PATCH,  # replaces the verifier's repeat phase, reached by a string path
    "reader": off.reference_cache_reader(str(reference_cache_dir())),  # copies cached reference answers
    "sampled": off.SAMPLED_CACHE,  # outputs cached by a few sampled input elements
    "numpy": off.NUMPY_BLAS,  # numpy does the work beside a trivial kernel
}
# a thread that writes after return may also take the worker down with it (seen in CI: exit 139)
EXPECTED = {"stale": ("stale_output",), "cache": ("stale_output",), "partial": ("stale_output",),
            "late": ("async_work_left", "crashed"), "forge": ("harness_tampering",),
            "hook": ("global_state_tampering",), "patch": ("harness_tampering",), "reader": ("output_mismatch",),
            "sampled": ("stale_output",), "numpy": ("foreign_compute",)}
ANALYSIS = {"bottleneck": "memory", "evidence": {}, "actions": [], "summary": "streaming kernel"}


def respond(request: Received) -> Reply:
    if "performance analyst" in request.user_text:
        return ok(json.dumps(ANALYSIS))
    model = str(request.body.get("model", "")).rsplit("/", 1)[-1]
    return ok(f"```python\n{CANDIDATES[model]}```\n")


def test_the_pipeline_rejects_each_offender_with_its_reason(tmp_path: Path) -> None:
    import duckdb

    with ScriptedServer(responder=respond) as srv:
        write_config(
            tmp_path, eager_only=True,
            agents={name: {"kind": "litellm", "model": f"openai/{name}", "api_base": srv.api_base,
                           "timeout_s": 30, "num_retries": 1} for name in CANDIDATES},
            suites={"refs": {"path": str(REPO / "refs" / "cpu"), "include": ["problem"]}},
            run={"agents": list(CANDIDATES), "platforms": ["cpu"], "suites": ["refs"]},
            rounds={"functional": 0, "optimization": 0},
        )
        snakemake(tmp_path, timeout=600)
    rel = duckdb.sql(f"select * from '{tmp_path / 'artifacts' / 'report.parquet'}'")
    rows = {r["agent"]: r for r in (dict(zip(rel.columns, t, strict=True)) for t in rel.fetchall())}
    assert sorted(rows) == sorted(CANDIDATES)

    honest = rows["honest"]
    assert honest["verified"] and honest["status"] in ("shipped", "no_gain"), honest["detail"]
    assert honest["candidate_ms"] > 0 and honest["eager_ms"] > 0
    verdicts = duckdb.sql(f"select agent, verdict_reason from "
                          f"'{tmp_path / 'artifacts' / 'tables' / 'verifications.parquet'}'").fetchall()
    reasons = dict(verdicts)
    assert reasons["honest"] == "ok"
    for name, allowed in EXPECTED.items():
        row = rows[name]
        assert row["status"] == "failed" and not row["shipped"] and row["shipped_speedup"] == 1.0, (name, row["detail"])
        assert row["candidate_ms"] is None, (name, row["candidate_ms"])
        # caught by verification, or else by the checked timing of select
        where = reasons[name] if reasons[name] != "ok" else str(row["detail"])
        assert any(reason in where for reason in allowed), (name, reasons[name], row["detail"])
