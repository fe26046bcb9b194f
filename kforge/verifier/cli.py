"""``kforge verify CANDIDATE.py --problem PROBLEM.py [--platform cpu] [--policy strict]``.

Exit codes: 0 verified, 1 rejected (reason code printed), 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kforge.verifier.verify import verify_candidate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kforge verify", description="Verify a candidate kernel module.")
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--problem", type=Path, required=True)
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--policy", choices=["strict", "relaxed"], default="strict")
    parser.add_argument("--preset", default="ci")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    for label, path in (("candidate", args.candidate), ("problem", args.problem)):
        if not path.is_file():
            print(f"kforge verify: {label} file not found: {path}", file=sys.stderr)
            return 2
    verdict = verify_candidate(args.candidate.read_text(), args.problem, platform=args.platform,
                               policy=args.policy, preset=args.preset, trials=args.trials,
                               timeout_s=args.timeout)
    status = "VERIFIED" if verdict.ok else "REJECTED"
    print(f"{status} reason={verdict.reason} policy={verdict.policy} atol={verdict.atol:g} "
          f"rtol={verdict.rtol:g} trials={verdict.trials} sandbox={verdict.sandbox}")
    if verdict.max_abs_err is not None:
        print(f"max_abs_err={verdict.max_abs_err:.3g} rel_err_norm={verdict.rel_err_norm:.3g}")
    if verdict.detail:
        print(verdict.detail)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
