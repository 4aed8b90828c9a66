#!/bin/bash
# As run on 2026-11-28 on the project's 2-core machine. /tmp/jax083 and /tmp/jax09 were made with
# `uv venv` + `uv pip install jax==X jaxlib==X flax optax -e .`; /tmp/accelperf-envs/<key> are
# overlays built by pytest_accelperf.envs.cache.env_from_pins (ACCELPERF_ENV_CACHE=/tmp/accelperf-envs).
# flax 0.11.2 -> 0.12.6 under jax 0.8.3 (flax 0.11.2 does not import under jax 0.10.2).
set -u
while [ "$(grep -c '^rc=' /tmp/upgrade-runs/summary2.txt)" -lt 4 ]; do sleep 10; done
cd /work/main
run() {
  local name=$1 py=$2 store=$3 mode=$4; shift 4
  echo "== $name $(uptime)"
  local start=$(date +%s)
  $py -m pytest "$@" -p no:cacheprovider --accel=cpu --accelperf-baselines=$store $mode \
     --accelperf-json=/tmp/upgrade-runs/$name.json --accelperf-explain=off -q > /tmp/upgrade-runs/$name.log 2>&1
  echo "rc=$? $(( $(date +%s) - start )) s $(uptime)"
}
rm -rf /tmp/upgrade-runs/store-flax
run flax0112 /tmp/accelperf-envs/86492b1fb87e31e71867/bin/python /tmp/upgrade-runs/store-flax --accelperf-update suites/flax
run flax0126 /tmp/jax083/bin/python /tmp/upgrade-runs/store-flax "" suites/flax
