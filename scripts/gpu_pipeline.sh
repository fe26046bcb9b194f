#!/usr/bin/env bash
# Run the pipeline on a GPU host that has torch and Triton but not KForge's own dependencies:
#   scripts/gpu_pipeline.sh WHEELS_DIR CONFIG [OUT_DIR] [extra snakemake args...]
# WHEELS_DIR holds py3.12 wheels for snakemake, pydantic and their needs (see docs/GPU.md);
# the report, the stage tables and a summary land in OUT_DIR.
set -uo pipefail
wheels=$1; config=$2; out=${3:-gpu-results}; shift 3 || shift $#
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$PWD/.kforge-site" "$wheels"/*.whl || exit 1
export PYTHONPATH="$PWD/.kforge-site":$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/gpu.csv" 2>&1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee "$out/versions.txt"
start=$(date +%s)
python3 -m snakemake --unlock artifacts/report.parquet --configfile "$config" > /dev/null 2>&1  # a lock left by a cut run
timeout -k 20 "${GPU_PIPELINE_TIMEOUT:-86400}" python3 -m snakemake artifacts/report.parquet --cores "$(nproc)" "$@" --configfile "$config" > "$out/snakemake.log" 2>&1
rc=$?
pkill -KILL -f 'kforge[.]stages' 2>/dev/null; pkill -KILL -f 'kforge[.]verifier[.]worker' 2>/dev/null  # nothing outlives a cut run
echo "snakemake exit $rc after $(( $(date +%s) - start )) s" | tee -a "$out/versions.txt"
if [ -f artifacts/report.parquet ] && [ $rc -eq 0 ]; then
  cp artifacts/report.parquet "$out/"
  python3 -m kforge.cli report artifacts/report.parquet > "$out/report.txt" 2>&1
else  # cut or failed: report the cells that finished, outside artifacts/ so a rerun resumes
  config_json=$(ls -t artifacts/config/*.json | head -1)
  python3 -m kforge.stages report --config "$config_json" --inputs artifacts/runs/*/*/*/*/best.json \
    --out "$out/report_partial.parquet" && echo "partial report: only the cells that finished" | tee -a "$out/versions.txt"
  python3 -m kforge.cli report "$out/report_partial.parquet" > "$out/report.txt" 2>&1
fi
tar czf "$out/artifacts.tgz" --exclude='artifacts/build' --exclude='artifacts/cas/sha256' artifacts/runs artifacts/tables artifacts/logs artifacts/ledger.jsonl 2>/dev/null
cat "$out/report.txt"
exit $rc
