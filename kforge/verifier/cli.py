"""``kforge verify CANDIDATE.py --problem PROBLEM.py [--platform cpu] [--policy strict]``.

Builds the candidate with the platform's build (as the pipeline's compile stage does), then
verifies it. Exit codes: 0 verified, 1 rejected (reason code printed) or build failed
(compiler log printed), 2 bad usage, 3-8 the user mistakes of ``preflight.py`` (one line
each, never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kforge.verifier.preflight import UserError, prepare


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--problem", type=Path, required=True)
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--policy", choices=["strict", "relaxed"], default="strict")
    parser.add_argument("--preset", default="ci")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--build-dir", type=Path, default=None,
                        help="where built kernels go (default $KFORGE_BUILD_DIR or ~/.cache/kforge/<platform>)")
    return parser


def report_user_error(prog: str, err: UserError) -> int:
    if err.log:
        print(err.log.rstrip(), file=sys.stderr)
    print(f"{prog}: {err.message}", file=sys.stderr)
    return err.code


def main(argv: list[str] | None = None) -> int:
    from kforge.verifier.verify import verify_candidate

    parser = _parser("kforge verify", "Build, then verify a candidate kernel module.")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    try:
        source, build_dir = prepare(args.candidate, args.problem, args.platform, args.build_dir)
    except UserError as err:
        return report_user_error("kforge verify", err)
    verdict = verify_candidate(source, args.problem, platform=args.platform,
                               policy=args.policy, preset=args.preset, trials=args.trials,
                               timeout_s=args.timeout, build_dir=build_dir)
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
