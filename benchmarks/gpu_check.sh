#!/usr/bin/env bash
# The prepared GPU check, for a session whose task is lent a GPU machine
# (device tool: one run, results under $OUT).  It sets the project up with
# the CUDA build of torch, runs benchmarks/gpu_two_dc.yaml, and checks that
# (1) the workers ran on CUDA and (2) the bytes the schemes report crossing
# DCs were seen on the emulated WAN interfaces (the report's byte table).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
TORCH_VARIANT=cuda scripts/bootstrap.sh 2>&1 | tail -5
.venv/bin/python -c 'import torch; print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))' | tee "$OUT/cuda.txt"
.venv/bin/testbed doctor | tee "$OUT/doctor.txt" || true
.venv/bin/testbed run benchmarks/gpu_two_dc.yaml --results "$OUT/results" 2>&1 | tail -20 | tee "$OUT/run.txt"
run=$(ls -d "$OUT"/results/gpu_two_dc/*/ | tail -1)
grep -h '"device"' "$run"/trials/*/jobs/0.json | head -2 | tee -a "$OUT/run.txt"
grep -l "cuda" "$run"/trials/*/logs/*.log | head -3 | tee -a "$OUT/run.txt" || true
cp "$run/summary.md" "$OUT/summary.md"
sed -n '/Per trial/,/^$/p' "$OUT/summary.md"
