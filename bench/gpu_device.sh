#!/usr/bin/env bash
# The GPU check in one call on a lent device machine, which reaches no package index: install the
# wheels `make gpu-wheels` put in .whl/ (carried with the call), then run every cuda path once.
#   make gpu-wheels                      # here, once
#   device run: command "bash bench/gpu_device.sh", carry [".whl"], timeout_s 600
# Writes gpu.json, gpu.log and nvidia-smi.txt to $OUT (bench/out when OUT is unset).
set -uo pipefail
out=${OUT:-bench/out}
mkdir -p "$out"
py=${PYTHON:-python3}
if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "no wheels in .whl/: run 'make gpu-wheels' first and carry .whl" >&2
    exit 3
fi
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/sf-site .whl/*.whl \
    || { echo "installing the carried wheels failed" >&2; exit 3; }
export PYTHONPATH="$PWD:/tmp/sf-site" PATH="/tmp/sf-site/bin:$PATH" PYTHONUNBUFFERED=1
{ nvidia-smi; "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"; } \
    >"$out/nvidia-smi.txt" 2>&1
# bench.gpu keeps itself within 8 minutes; the timeout only guards against a hang, leaving time to copy $OUT back.
timeout -k 10 560 "$py" -m bench.gpu --json "$out/gpu.json" 2>&1 | tee "$out/gpu.log"
exit "${PIPESTATUS[0]}"
