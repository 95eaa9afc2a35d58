#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py; README "GPU check").
#
#   benchmarks/gpu_check.sh --prepare    here, before a device run: the wheels the GPU machine's own
#                                        Python 3.12 may lack, into .gpu_wheels/ (git-ignored, ~4 MB)
#   benchmarks/gpu_check.sh [--device cpu]   there (device tool: carry .gpu_wheels), results under $OUT
#
# The GPU machine has its own Python with torch (CUDA) and no package registries: the check uses that
# torch and installs nothing into the system.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --prepare ]; then
  PY="${PY:-.venv/bin/python}"
  pins=$("$PY" - <<'PY'
from importlib.metadata import version
print(" ".join(f"{d}=={version(d)}" for d in ("pydantic", "pydantic_core", "annotated_types", "typing_inspection",
                                               "typing_extensions", "psutil", "pyroute2")), "PyYAML>=6.0.1")
PY
)
  # shellcheck disable=SC2086
  "$PY" -m pip download --quiet --dest .gpu_wheels --only-binary=:all: --no-deps --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any $pins
  du -sh .gpu_wheels
  exit 0
fi
exec "${GPU_PYTHON:-python3}" benchmarks/gpu_check.py "$@"
