"""The verifier: sandboxed correctness checks, reward-hack detection and honest timing.

Public API (the pipeline calls exactly these)::

    verify_candidate(source, problem_path, *, platform, policy, ...) -> Verdict
    profile_candidate(source, problem_path, *, platform, ...)        -> Profile
    measure_peaks(device, cache_dir)                                  -> Peaks
    static_check(source, problem_source, *, platform)                 -> list[Finding]

See docs/VERIFY_DESIGN.md for the design and the threat model.
"""

from __future__ import annotations

from kforge.verifier.checks import Finding, static_check
from kforge.verifier.peaks import Peaks, measure_peaks
from kforge.verifier.profiling import profile_candidate
from kforge.verifier.reasons import Reason
from kforge.verifier.verify import verify_candidate

__all__ = ["Finding", "Peaks", "Reason", "measure_peaks", "profile_candidate", "static_check",
           "verify_candidate"]
