#!/usr/bin/env bash
# The wheels the device machine's image lacks (Python 3.12, no network), downloaded into
# .whl/ (git-ignored) to be carried with every device call (tools/gpu_run.sh installs
# them into /tmp/site): pydantic and its parts, platformdirs, accelerated-scan (the outside
# peer of the benchmark), pytest-xdist and execnet (GPU tests compile in parallel).
#     tools/gpu_wheels.sh [DEST]        (default .whl)
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl}"
python3 -m pip download -q --no-deps -d "$dest" --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection typing-extensions \
    platformdirs accelerated-scan==0.3.1 pytest-xdist execnet
ls "$dest"
