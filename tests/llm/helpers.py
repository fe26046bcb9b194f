"""Shared pieces of the LLM tests: agent configs, requests, replies.

Every test here talks real HTTP to ``tests/llm/server.py`` on 127.0.0.1 through litellm's own
network path (``model="openai/<name>"``, ``api_base=http://127.0.0.1:<port>/v1``).
"""

from __future__ import annotations

from typing import Any

from kforge.config import AgentConfig
from kforge.schema import (
    AnalysisRequest,
    Feedback,
    GenerationRequest,
    KernelStat,
    OneShotExample,
    Profile,
    Timing,
)

from .server import ScriptedServer

PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(64, 64)]


def get_init_inputs():
    return []
"""

GOOD_KERNEL = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel(x, out)
        return out
"""

BROKEN_KERNEL = GOOD_KERNEL.replace("relu_kernel(x, out)", "relu_kernel(x, out")


def fenced(source: str, prose: str = "Here is the kernel.") -> str:
    return f"{prose}\n\n```python\n{source}```\n"


def agent_config(srv: ScriptedServer, **overrides: Any) -> AgentConfig:
    settings: dict[str, Any] = {
        "kind": "litellm",
        "model": "openai/kforge-test",
        "api_base": srv.api_base,
        "timeout_s": 5.0,
        "num_retries": 3,
        "input_cost_per_token": 0.0,
        "output_cost_per_token": 0.0,
    }
    settings.update(overrides)
    return AgentConfig.model_validate(settings)


def example() -> OneShotExample:
    return OneShotExample(
        platform="cpu",
        problem_source="class Model: ...  # example reference\n",
        solution_source="class ModelNew: ...  # example solution\n",
        notes="Write C++ and call it through ctypes.",
    )


def generation_request(round: int = 0, **kw: Any) -> GenerationRequest:
    settings: dict[str, Any] = {
        "problem_name": "relu",
        "problem_source": PROBLEM,
        "platform": "cpu",
        "example": example(),
        "policy": "strict",
        "round": round,
    }
    settings.update(kw)
    return GenerationRequest.model_validate(settings)


def feedback(detail: str, stage: str = "compile", reason: str = "build_failed") -> Feedback:
    return Feedback.model_validate({"stage": stage, "reason": reason, "detail": detail})


def timing(ms: float) -> Timing:
    return Timing(median_ms=ms, mean_ms=ms, cv=0.01, reps=20, min_ms=ms)


def profile() -> Profile:
    return Profile(
        ok=True,
        device="cpu",
        candidate=timing(0.8),
        eager=timing(1.0),
        compiled=timing(0.6),
        kernels=[
            KernelStat(name="relu_kernel", calls=20, total_us=12000.0),
            KernelStat(name="copy_", calls=20, total_us=3000.0),
        ],
        flops=4096.0,
        min_bytes=32768.0,
        achieved_gflops=0.005,
        peak_gflops=100.0,
        achieved_gbps=0.04,
        peak_gbps=20.0,
        roofline_ms=0.002,
    )


def analysis_request(**kw: Any) -> AnalysisRequest:
    settings: dict[str, Any] = {
        "problem_name": "relu",
        "platform": "cpu",
        "policy": "strict",
        "candidate_source": GOOD_KERNEL,
        "profile": profile(),
    }
    settings.update(kw)
    return AnalysisRequest.model_validate(settings)
