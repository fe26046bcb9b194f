#!/usr/bin/env bash
# Everything the H200 runs for KForge, in phases that resume across device calls:
#   scripts/h200_session.sh WHEELS_DIR OUT_DIR SECONDS
# KFORGE_SESSION_PHASES picks and orders the phases (default "pipeline gputests baselines"):
#   smoke             scripts/sandbox_gpu_smoke.sh (~1 min): CUDA, IPC, Triton and torch.compile's
#                     warm cache inside the sandbox;
#                     if it fails, no later phase runs (every sandboxed GPU job would fail)
#   pipeline          scripts/gpu_pipeline.sh over $KFORGE_SESSION_CONFIG (default configs/h200.yaml)
#   pipeline:POLICY   the same with the config's `policy:` set to POLICY (strict, relaxed, ...);
#                     each policy's report and run records land in OUT_DIR/pipeline_POLICY
#   verifygpu         issue 15's GPU rows: benchmarks/verify_gpu_check.py, then
#                     pytest -m gpu tests/verifier/test_gpu_verify.py
#   gputests          pytest -m gpu for the verifier's and the platforms' GPU rows (4 files at once)
#   pytest:FILE       pytest -m gpu FILE alone (output kept, -s: what the test prints), in an
#                     equal share of the time left per phase still to run; with
#                     KFORGE_SESSION_STOP_ON_FAIL set, a failing FILE ends the call there;
#                     KFORGE_SESSION_XDIST=N runs it under pytest-xdist -n N (pytest_xdist and
#                     execnet wheels in WHEELS_DIR; -s output is then lost, -rA keeps the verdicts)
#   baselines         benchmarks/baselines.py --preset full --device cuda for starter, level1, level2
# KFORGE_SNAKEMAKE_ARGS goes to every pipeline's snakemake (e.g. --prioritize TARGETS...).
# Each phase is skipped once done (markers in .h200-state/, which survives while the device
# machine stays warm, or comes back as a carried folder). SECONDS bounds the whole call; each
# phase gets what is left, less a reserve for packing up.
set -uo pipefail
wheels=$1; out=$2; budget=$3
phases=${KFORGE_SESSION_PHASES:-pipeline gputests baselines}
base_config=${KFORGE_SESSION_CONFIG:-configs/h200.yaml}
state=.h200-state
mkdir -p "$out" "$state"
deadline=$(( $(date +%s) + budget - 25 ))
left() { echo $(( deadline - $(date +%s) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$PWD/.kforge-site" "$wheels"/*.whl || exit 1
export PYTHONPATH="$PWD/.kforge-site":$PWD${PYTHONPATH:+:$PYTHONPATH}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit (plus the working tree as copied), start $(date -u +%FT%TZ), phases: $phases" | tee "$out/session.txt"

code=$(find kforge -type f \( -name '*.py' -o -name '*.md' \) | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
if [ -f "$state/code" ] && [ "$(cat "$state/code")" != "$code" ]; then  # see docs/GPU.md
  echo "WARNING: kforge/ changed since this run began: verify, profile and select redo their work" | tee -a "$out/session.txt"
fi
[ -f "$state/code" ] || echo "$code" > "$state/code"

run_pipeline() {  # $1: marker name, $2: config file, $3: output folder
  local name=$1 config=$2 dest=$3 rc
  # a pipeline cut in an earlier call resumes from its carried records
  if [ -f "$state/$name.tgz" ] && [ ! -f "$state/$name.unpacked" ]; then
    rm -rf artifacts .snakemake/metadata && tar xzf "$state/$name.tgz" && touch "$state/$name.unpacked"
  fi
  GPU_PIPELINE_TIMEOUT=$(( $(left) - 40 )) bash scripts/gpu_pipeline.sh "$wheels" "$config" "$dest" ${KFORGE_SNAKEMAKE_ARGS:-}
  rc=$?
  [ $rc -ne 124 ] && [ $rc -ne 137 ] && touch "$state/$name.done"  # finished, failed jobs or not
  echo "$name exit $rc" | tee -a "$out/session.txt"
  # ninja's logs of the CUDA extension builds: did a verify worker rebuild what compile built?
  find artifacts/build -name .ninja_log -print0 2>/dev/null | tar czf "$dest/ninja_logs.tgz" --null -T - 2>/dev/null
  # the run's state, small enough to carry back into a cold machine: no build folders but the
  # warm jobs' compile caches (a few hundred KB a problem), which the timing jobs would
  # otherwise recompile cold (~10 s each, with the GPU held)
  tar cf "$state/$name.tar" --exclude='artifacts/build' artifacts .snakemake/metadata 2>/dev/null
  [ -d artifacts/build/compile_cache ] && tar rf "$state/$name.tar" artifacts/build/compile_cache
  gzip -f "$state/$name.tar" && mv "$state/$name.tar.gz" "$state/$name.tgz"
  cp "$state/$name.tgz" "$out/state_$name.tgz"
  if [ -f "$state/$name.done" ]; then rm -rf artifacts .snakemake/metadata; fi  # the next policy starts clean
}

for phase in $phases; do
  [ "$(left)" -gt 60 ] || { echo "no time left for $phase" | tee -a "$out/session.txt"; break; }
  case $phase in
    smoke)
      [ -f "$state/smoke.done" ] && continue
      mkdir -p "$out/smoke"
      bash scripts/sandbox_gpu_smoke.sh "$out/smoke" > /dev/null 2>&1
      if [ "$(grep -c "^SMOKE PASS" "$out/smoke/sandbox_smoke.txt" 2>/dev/null)" = 2 ]; then  # both parts
        touch "$state/smoke.done"; echo "sandbox smoke PASS" | tee -a "$out/session.txt"
      else
        echo "sandbox smoke FAILED: no later phase runs" | tee -a "$out/session.txt"
        tail -20 "$out/smoke/sandbox_smoke.txt" 2>/dev/null
        break
      fi ;;
    pipeline)
      [ -f "$state/pipeline.done" ] || run_pipeline pipeline "$base_config" "$out/pipeline" ;;
    pipeline:*)
      policy=${phase#pipeline:}; name=pipeline_$policy
      [ -f "$state/$name.done" ] && continue
      sed -E "s/^policy:.*/policy: $policy/" "$base_config" > "$state/$name.yaml"
      if [ -f "$state/compare_host" ]; then
        sed -i -E "s/^(  compare:).*/\1 host/" "$state/$name.yaml"
        echo "$name: outputs compared on the host (no on-device judge here)" | tee -a "$out/session.txt"
      fi
      grep -q "^policy: $policy\$" "$state/$name.yaml" || echo "policy: $policy" >> "$state/$name.yaml"
      run_pipeline "$name" "$state/$name.yaml" "$out/$name" ;;
    verifygpu)
      [ -f "$state/verifygpu.done" ] && continue
      mkdir -p "$out/verifygpu"
      timeout -k 10 $(( $(left) / 2 )) python3 benchmarks/verify_gpu_check.py --out "$out/verifygpu" \
        > "$out/verifygpu/check.log" 2>&1
      echo "verify_gpu_check exit $?" | tee -a "$out/session.txt"
      # the pipeline phases compare on the host if the honest control did not verify on the device
      python3 -c 'import json, sys; rows = json.load(open(sys.argv[1]))["rows"]
sys.exit(0 if any(r["kind"] == "verify full" and r["candidate"] == "HONEST" and r["pass"] for r in rows) else 1)' \
        "$out/verifygpu/verify_gpu_check.json" 2>/dev/null || touch "$state/compare_host"
      timeout -k 10 $(( $(left) - 20 )) python3 -m pytest -q -m gpu -p no:cacheprovider -rA \
        tests/verifier/test_gpu_verify.py > "$out/verifygpu/gpu_verify_tests.txt" 2>&1
      rc=$?
      echo "test_gpu_verify exit $rc" | tee -a "$out/session.txt"
      tail -15 "$out/verifygpu/gpu_verify_tests.txt"
      [ $rc -ne 124 ] && [ $rc -ne 137 ] && touch "$state/verifygpu.done" ;;
    gputests)
      [ -f "$state/gputests.done" ] && continue
      # The four GPU test files at once (correctness rows, no timing floors; builds use the cores).
      pids=()
      for f in tests/verifier/test_gpu_faults.py tests/verifier/test_gpu_sanitizer.py tests/platforms/test_gpu_platforms.py tests/platforms/test_gpu_graph.py; do
        timeout -k 10 $(( $(left) - 20 )) python3 -m pytest -q -m gpu -p no:cacheprovider -rA "$f" \
          > "$out/gpu_tests_$(basename "$f" .py).txt" 2>&1 &
        pids+=($!)
      done
      rc=0
      for pid in "${pids[@]}"; do wait "$pid"; r=$?; [ $r -gt $rc ] && rc=$r; done
      cat "$out"/gpu_tests_test_*.txt > "$out/gpu_tests.txt"
      [ $rc -ne 124 ] && [ $rc -ne 137 ] && touch "$state/gputests.done"
      echo "gpu tests exit $rc" | tee -a "$out/session.txt"
      tail -30 "$out/gpu_tests.txt" ;;
    pytest:*)
      file=${phase#pytest:}; name=pytest_$(basename "$file" .py)
      [ -f "$state/$name.done" ] && continue
      # an equal share of what is left for each phase still to run (this one included): a fixed
      # third cut the CUDA backend's test (40 nvcc builds, ~9 min alone) at 186 s on 2026-12-07
      rest=$(( $(printf '%s\n' $phases | sed -n "/^${phase//\//\\/}\$/,\$p" | wc -l) ))
      xdist=()
      [ -n "${KFORGE_SESSION_XDIST:-}" ] && xdist=(-n "$KFORGE_SESSION_XDIST")  # builds on the cores
      timeout -k 10 $(( $(left) / (rest > 0 ? rest : 1) )) python3 -m pytest -q -s -m gpu -p no:cacheprovider \
        -rA "${xdist[@]}" "$file" > "$out/$name.txt" 2>&1
      rc=$?
      [ $rc -ne 124 ] && [ $rc -ne 137 ] && touch "$state/$name.done"
      echo "$name exit $rc" | tee -a "$out/session.txt"
      tail -25 "$out/$name.txt"
      if [ $rc -ne 0 ] && [ -n "${KFORGE_SESSION_STOP_ON_FAIL:-}" ]; then
        echo "$name failed: the phases after it are not run (KFORGE_SESSION_STOP_ON_FAIL)" | tee -a "$out/session.txt"
        break
      fi ;;
    baselines)
      for suite in starter level1 level2; do
        [ -f "$state/baselines_$suite.done" ] && continue
        [ "$(left)" -gt 60 ] || break
        timeout -k 10 $(( $(left) - 10 )) python3 benchmarks/baselines.py --suite "problems/$suite" \
          --preset full --device cuda --compile-workers 8 --markdown "$out/baselines_${suite}_h200.md" \
          > "$out/baselines_$suite.log" 2>&1
        rc=$?
        [ $rc -le 1 ] && touch "$state/baselines_$suite.done"  # 1: some problems skipped
        echo "baselines $suite exit $rc" | tee -a "$out/session.txt"
      done ;;
    *) echo "unknown phase $phase" | tee -a "$out/session.txt" ;;
  esac
done
ls "$state" | tee -a "$out/session.txt"
# A call brings back at most 8 files: everything but these goes into one tarball.
( cd "$out" && find . -type f ! -name session.txt ! -name 'state_*.tgz' ! -name results.tgz -print0 \
    | tar czf results.tgz --null -T - --remove-files ) 2>/dev/null
find "$out" -mindepth 1 -type d -empty -delete 2>/dev/null
