"""A result pipe cut short says why: the size cap or the memory cap, not tampering; a torn pipe
from a worker that ended on its own still is tampering."""

from __future__ import annotations

import pytest

from kforge.verifier.protocol import encode_frame
from kforge.verifier.reasons import Reason
from kforge.verifier.runner import interpret
from kforge.verifier.sandbox import SandboxResult

NONCE = b"n" * 16


def _torn() -> bytes:
    whole = encode_frame(NONCE, {"kind": "case"}, [b"x" * 1000])
    return whole[: len(whole) - 10]


@pytest.mark.parametrize(("flags", "reason"), [
    ({"result_overflow": True}, Reason.OUTPUT_FLOOD),
    ({"oom": True, "returncode": -9}, Reason.OOM),
    ({"pids_limited": True, "returncode": -9}, Reason.PROCESS_LIMIT),
    ({}, Reason.HARNESS_TAMPERING),
])
def test_a_torn_result_is_reported_by_its_cause(flags: dict, reason: Reason) -> None:
    base = {"returncode": 0, "timed_out": False, "oom": False, "pids_limited": False, "output_flood": False,
            "stdout": "", "stderr": "", "result": _torn(), "result_overflow": False, "mode": "test", "seconds": 1.0}
    outcome = interpret(SandboxResult(**{**base, **flags}), NONCE, None)
    assert outcome.reason == reason, outcome.detail
