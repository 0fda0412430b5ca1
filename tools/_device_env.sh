# Sourced by tools/gpu_run.sh (run from the repo root on the device machine): the carried
# wheels (.whl, see tools/gpu_wheels.sh) installed into /tmp/site,
# the environment the tests and benchmarks read, and what machine this is.  A failed install
# prints pip's last lines and exits the calling script.
if ! _pip_log=$(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl 2>&1); then
    echo "$_pip_log" | tail -5
    exit 1
fi
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 SAMU_TUNE_CACHE_DIR=/tmp/samu_tune_cache
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
