"""The verifier: sandboxed correctness checks, reward-hack detection and honest timing.

Public API (the pipeline calls exactly these)::

    verify_candidate(source, problem_path, *, platform, policy, ...) -> Verdict
    profile_candidate(source, problem_path, *, platform, ...)        -> Profile
    measure_peaks(device, cache_dir)                                  -> Peaks
    static_check(source, problem_source, *, platform)                 -> list[Finding]

The names load on first use: a sandboxed worker (``python -m kforge.verifier.worker_main``)
imports this package too, and must not pull in the parent's side (numpy for the comparisons:
on the cpu platform a candidate's view has no numpy at all).

See docs/VERIFY_DESIGN.md for the design and the threat model.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {"Finding": "checks", "static_check": "checks", "Peaks": "peaks", "measure_peaks": "peaks",
         "profile_candidate": "profiling", "Reason": "reasons", "verify_candidate": "verify"}

__all__ = ["Finding", "Peaks", "Reason", "measure_peaks", "profile_candidate", "static_check",
           "verify_candidate"]


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"kforge.verifier.{_HOME[name]}"), name)
    raise AttributeError(f"module 'kforge.verifier' has no attribute {name!r}")
