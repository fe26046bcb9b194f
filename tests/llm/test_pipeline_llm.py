"""End to end: the real Snakemake pipeline with a ``kind: litellm`` agent on a local server.

One problem (the starter suite's swish + bias + tanh), two rounds (a repair pass). The scripted model first answers
with a kernel that does not compile, then, once the compile error is in its prompt, with the
right one; analyses get a recommendation. The run must end with a verified candidate, the
repair request must carry the compiler's error, and a second run against a restarted server
(another port, same model) must make no HTTP request at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pipeline_helpers import REPO, snakemake, write_config

from .server import Received, Reply, ScriptedServer, ok

pytestmark = pytest.mark.slow

PROBLEM = "elementwise_swish_bias"
GOOD = '''"""tanh(x * sigmoid(x) + bias) in one pass over the rows."""

import torch
import torch.nn as nn

from kforge.platforms import cpu_runtime

CPP_SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <omp.h>

extern "C" void swish_bias_tanh(const float* __restrict x, const float* __restrict bias,
                                float* __restrict y, int64_t rows, int64_t cols,
                                int64_t nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        for (int64_t c = 0; c < cols; ++c) {
            const float v = xr[c];
            yr[c] = std::tanh(v / (1.0f + std::exp(-v)) + bias[c]);
        }
    }
}
"""

lib = cpu_runtime.load_library(CPP_SOURCE)
KERNEL = cpu_runtime.entry(lib, "swish_bias_tanh", "pppiii")


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = cpu_runtime.as_input(x)
        bias = cpu_runtime.as_input(self.bias.detach())
        cols = x.shape[-1]
        rows = x.numel() // cols if cols else 0
        y = torch.empty_like(x)
        cpu_runtime.launch(KERNEL, "swish_bias_tanh", x.data_ptr(), bias.data_ptr(),
                           y.data_ptr(), rows, cols, cpu_runtime.threads())
        return y
'''
BROKEN = GOOD.replace("+ bias[c]);", "+ bias[c])")
assert BROKEN != GOOD
RECOMMENDATION = {
    "bottleneck": "memory",
    "evidence": {"achieved_gbps": 1.0},
    "actions": [
        {"kind": "vectorize", "params": {}, "expected_gain": 1.1, "rationale": "wider loads"}
    ],
    "summary": "Streaming kernel; little left to gain.",
}


def respond(request: Received) -> Reply:
    """The scripted model: answers by what it is asked."""
    text = request.user_text
    if "performance analyst" in text:
        return ok(json.dumps(RECOMMENDATION))
    if "What went wrong last round" in text or "Performance analysis of the previous" in text:
        return ok(f"Fixed:\n```python\n{GOOD}```\n")
    return ok(f"```python\n{BROKEN}```\n")


def configure(workdir: Path, srv: ScriptedServer) -> None:
    write_config(
        workdir,
        eager_only=True,  # the LLM seam is under test, not the baselines (tests/test_pipeline.py)
        agents={
            "local": {
                "kind": "litellm",
                "model": "openai/kforge-scripted",
                "api_base": srv.api_base,
                "timeout_s": 30,
                "num_retries": 1,
                "input_cost_per_token": 1e-6,
                "output_cost_per_token": 2e-6,
            }
        },
        suites={"one": {"path": str(REPO / "problems" / "starter"), "include": [PROBLEM]}},
        run={"agents": ["local"], "platforms": ["cpu"], "suites": ["one"]},
        rounds={"functional": 1, "optimization": 0},
    )


def report_rows(workdir: Path) -> list[dict[str, object]]:
    import duckdb  # lazily: GPU hosts collect this module through the toy-platform test

    rel = duckdb.sql(f"select * from '{workdir / 'artifacts' / 'report.parquet'}'")
    return [dict(zip(rel.columns, row, strict=True)) for row in rel.fetchall()]


def test_pipeline_with_an_llm_agent(tmp_path: Path) -> None:
    workdir = tmp_path

    with ScriptedServer(responder=respond) as first:
        configure(workdir, first)
        snakemake(workdir, timeout=600)
    rows = report_rows(workdir)
    # verified; shipped or not depends on beating the baselines beyond the noise band here
    assert [(r["problem"], r["verified"]) for r in rows] == [(PROBLEM, True)], rows
    assert rows[0]["status"] in ("shipped", "no_gain"), rows
    assert rows[0]["prompt_tokens"] and rows[0]["cost_usd"] and rows[0]["cost_usd"] > 0
    # eager only (profile.compile_baseline: false): no compile figures, and the row says why
    assert rows[0]["eager_ms"] and rows[0]["compile_ms"] is None and rows[0]["speedup_vs_compile"] is None
    assert "torch.compile not timed" in str(rows[0]["detail"]), rows[0]["detail"]

    generations = [r for r in first.received if "performance analyst" not in r.user_text]
    assert len(generations) == 2
    assert "What went wrong last round" not in generations[0].user_text
    repair = generations[1].user_text
    assert "What went wrong last round" in repair
    assert "kernel.cpp:15:67: error: expected" in repair  # the compiler's words, from round 0
    assert "kernel.cpp" in repair and str(tmp_path) not in repair  # no absolute paths
    # the repair prompt carried the agent context: device sheet, contract, the round-0 ledger
    assert "The target device" in repair and "`syntax_error`" in repair
    assert "| 0 | initial | first candidate |" in repair

    with ScriptedServer(responder=respond) as second:  # restarted server, another port
        configure(workdir, second)
        snakemake(workdir, timeout=600)
        # every call answered from the store (a stage whose code changed mid-test re-profiles,
        # and a new profile is a new analysis request: run the test on a quiet tree)
        assert second.received == [], [r.user_text[:200] for r in second.received]
    assert [(r["problem"], r["verified"]) for r in report_rows(workdir)] == [(PROBLEM, True)]
