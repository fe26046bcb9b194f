#!/usr/bin/env bash
# Whole models through `kforge model` on a GPU host, resumable across device calls:
#   scripts/models_gpu.sh WHEELS_DIR STATE_DIR OUT_DIR SECONDS FOLDER [models_sweep.py run args...]
# e.g. scripts/models_gpu.sh .wheels312 .h200/models "$OUT" 560 ../shared/kernelbench/level3 \
#        --policy relaxed --only 1,2,3 --regions 4
# Runs `benchmarks/models_sweep.py run FOLDER --platform triton --preset full` (the files' own
# sizes), KFORGE_MODEL_JOBS files at once (default 1), the cores shared among them. The sweep's JSONL lives in STATE_DIR (carry
# it back in on the next call: files with a row are skipped, a file cut by the deadline has none
# and runs again); OUT_DIR gets the JSONL, the GPU's name and versions, and per file its
# model.json, regions.parquet, stitched.py, the regions' report and Snakemake log (no build folders).
set -uo pipefail
wheels=$1; state=$2; out=$3; budget=$4; folder=$5; shift 5
start=$(date +%s)
mkdir -p "$out" "$state"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$PWD/.kforge-site" "$wheels"/*.whl || exit 1
export PYTHONPATH="$PWD/.kforge-site":$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/gpu.csv" 2>&1
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)' \
  | tee "$out/versions.txt"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), start $(date -u +%FT%TZ)" | tee -a "$out/versions.txt"
jsonl="$state/sweep.jsonl"
left=$(( budget - ($(date +%s) - start) - 30 ))  # 30 s to pack up
jobs=${KFORGE_MODEL_JOBS:-1}
python3 benchmarks/models_sweep.py run "$folder" --out "$jsonl" --work .models/work --platform triton \
  --preset full --jobs "$jobs" --cores $(( $(nproc) / jobs )) --deadline "$left" "$@" 2>&1 | tee "$out/sweep.log"
pkill -KILL -f 'kforge[.]stages' 2>/dev/null; pkill -KILL -f 'kforge[.]verifier[.]worker' 2>/dev/null
[ -f "$jsonl" ] && cp "$jsonl" "$out/"
( cd .models/work 2>/dev/null && find . -maxdepth 2 \( -name model.json -o -name regions.parquet -o -name stitched.py \) -print0 \
    | tar czf "$out/models.tgz" --null -T - 2>/dev/null )
( cd .models/work 2>/dev/null && find . \( -path '*/pipeline/artifacts/report.parquet' -o -path '*/pipeline/.snakemake/log/*.log' \) -print0 \
    | tar czf "$out/reports.tgz" --null -T - 2>/dev/null )  # the Snakemake logs say how far a cut file got
echo "done after $(( $(date +%s) - start )) s" | tee -a "$out/versions.txt"
