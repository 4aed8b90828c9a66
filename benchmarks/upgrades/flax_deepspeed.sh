#!/bin/bash
# As run on 2026-11-28 on the project's 2-core machine. /tmp/jax083 and /tmp/jax09 were made with
# `uv venv` + `uv pip install jax==X jaxlib==X flax optax -e .`; /tmp/accelperf-envs/<key> are
# overlays built by pytest_accelperf.envs.cache.env_from_pins (ACCELPERF_ENV_CACHE=/tmp/accelperf-envs).
# After run.sh: flax 0.11.2 -> 0.12.8 on the Flax suites, DeepSpeed 0.18.9 -> 0.19.8 on two ZeRO cases.
set -u
while [ "$(grep -c '^rc=' /tmp/upgrade-runs/summary.txt)" -lt 3 ]; do sleep 10; done
cd /work/main
export TORCH_EXTENSIONS_DIR=/tmp/upgrade-runs/torch_ext
run() {  # name python store mode args...
  local name=$1 py=$2 store=$3 mode=$4; shift 4
  echo "== $name $(uptime)"
  local start=$(date +%s)
  $py -m pytest "$@" -p no:cacheprovider --accel=cpu --accelperf-baselines=$store $mode \
     --accelperf-json=/tmp/upgrade-runs/$name.json --accelperf-explain=off -q > /tmp/upgrade-runs/$name.log 2>&1
  echo "rc=$? $(( $(date +%s) - start )) s $(uptime)"
}
FLAX=/tmp/accelperf-envs/3d6a663a7be012a7ee51/bin/python
DS=/tmp/accelperf-envs/aed4ad713d419b111646/bin/python
MAIN=/work/main/.venv/bin/python
rm -rf /tmp/upgrade-runs/store-flax /tmp/upgrade-runs/store-ds
run flax011 $FLAX /tmp/upgrade-runs/store-flax --accelperf-update suites/flax
run flax012 $MAIN /tmp/upgrade-runs/store-flax "" suites/flax
K='test_zero and (zero2-b4 or zero3-b4) and not offload and not maxbatch'
run ds018 $DS /tmp/upgrade-runs/store-ds --accelperf-update suites/torch/test_deepspeed.py -k "$K"
run ds019 $MAIN /tmp/upgrade-runs/store-ds "" suites/torch/test_deepspeed.py -k "$K"
