#!/usr/bin/env bash
# Everything the H200 runs for KForge, in phases that resume across device calls:
#   scripts/h200_session.sh WHEELS_DIR OUT_DIR SECONDS
# Phases, in order, each skipped once done (markers in .h200-state/, which survives while the
# device machine stays warm, or comes back as a carried folder):
#   pipeline   scripts/gpu_pipeline.sh over configs/h200.yaml (resumes a cut run)
#   gputests   pytest -m gpu for the verifier's and the platforms' GPU rows (3 files at once)
#   baselines  benchmarks/baselines.py --preset full --device cuda for starter, level1, level2
# SECONDS bounds the whole call; each phase gets what is left, less a reserve for packing up.
set -uo pipefail
wheels=$1; out=$2; budget=$3
state=.h200-state
mkdir -p "$out" "$state"
deadline=$(( $(date +%s) + budget - 25 ))
left() { echo $(( deadline - $(date +%s) )); }
if [ -f "$state/artifacts.tgz" ] && [ ! -d artifacts/runs ]; then  # a carried run to resume
  tar xzf "$state/artifacts.tgz"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$PWD/.kforge-site" "$wheels"/*.whl || exit 1
export PYTHONPATH="$PWD/.kforge-site":$PWD${PYTHONPATH:+:$PYTHONPATH}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit (plus the working tree as copied), start $(date -u +%FT%TZ)" | tee "$out/session.txt"

code=$(find kforge -type f \( -name '*.py' -o -name '*.md' \) | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
if [ -f "$state/code" ] && [ "$(cat "$state/code")" != "$code" ]; then  # see docs/GPU.md
  echo "WARNING: kforge/ changed since this run began: verify, profile and select redo their work" | tee -a "$out/session.txt"
fi
[ -f "$state/code" ] || echo "$code" > "$state/code"

if [ ! -f "$state/pipeline.done" ] && [ "$(left)" -gt 60 ]; then
  GPU_PIPELINE_TIMEOUT=$(( $(left) - 40 )) bash scripts/gpu_pipeline.sh "$wheels" "${KFORGE_SESSION_CONFIG:-configs/h200.yaml}" "$out/pipeline"
  rc=$?
  [ $rc -ne 124 ] && [ $rc -ne 137 ] && touch "$state/pipeline.done"  # finished, failed jobs or not
  echo "pipeline exit $rc" | tee -a "$out/session.txt"
  # ninja's logs of the CUDA extension builds: did a verify worker rebuild what compile built?
  find artifacts/build -name .ninja_log -print0 2>/dev/null | tar czf "$out/ninja_logs.tgz" --null -T - 2>/dev/null
  # the run's state, small enough to carry back into a cold machine
  tar czf "$state/artifacts.tgz" --exclude='artifacts/build' artifacts .snakemake/metadata 2>/dev/null
  cp "$state/artifacts.tgz" "$out/state.tgz"
fi

if [ -f "$state/pipeline.done" ] && [ ! -f "$state/gputests.done" ] && [ "$(left)" -gt 60 ]; then
  # The three GPU test files at once (correctness rows, no timing floors; builds use the cores).
  pids=()
  for f in tests/verifier/test_gpu_faults.py tests/verifier/test_gpu_sanitizer.py tests/platforms/test_gpu_platforms.py; do
    timeout -k 10 $(( $(left) - 20 )) python3 -m pytest -q -m gpu -p no:cacheprovider -rA "$f" \
      > "$out/gpu_tests_$(basename "$f" .py).txt" 2>&1 &
    pids+=($!)
  done
  rc=0
  for pid in "${pids[@]}"; do wait "$pid"; r=$?; [ $r -gt $rc ] && rc=$r; done
  cat "$out"/gpu_tests_test_*.txt > "$out/gpu_tests.txt"
  [ $rc -ne 124 ] && [ $rc -ne 137 ] && touch "$state/gputests.done"
  echo "gpu tests exit $rc" | tee -a "$out/session.txt"
  tail -30 "$out/gpu_tests.txt"
fi

for suite in starter level1 level2; do
  [ -f "$state/gputests.done" ] || break
  [ -f "$state/baselines_$suite.done" ] && continue
  [ "$(left)" -gt 60 ] || break
  timeout -k 10 $(( $(left) - 10 )) python3 benchmarks/baselines.py --suite "problems/$suite" \
    --preset full --device cuda --compile-workers 8 --markdown "$out/baselines_${suite}_h200.md" \
    > "$out/baselines_$suite.log" 2>&1
  rc=$?
  [ $rc -le 1 ] && touch "$state/baselines_$suite.done"  # 1: some problems skipped
  echo "baselines $suite exit $rc" | tee -a "$out/session.txt"
done
ls "$state" | tee -a "$out/session.txt"
# A call brings back at most 8 files: everything but these two goes into one tarball.
( cd "$out" && find . -type f ! -name session.txt ! -name state.tgz ! -name results.tgz -print0 \
    | tar czf results.tgz --null -T - --remove-files ) 2>/dev/null
find "$out" -mindepth 1 -type d -empty -delete 2>/dev/null
