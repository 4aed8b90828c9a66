#!/bin/bash
# As run on 2026-11-28 on the project's 2-core machine. /tmp/jax083 and /tmp/jax09 were made with
# `uv venv` + `uv pip install jax==X jaxlib==X flax optax -e .`; /tmp/accelperf-envs/<key> are
# overlays built by pytest_accelperf.envs.cache.env_from_pins (ACCELPERF_ENV_CACHE=/tmp/accelperf-envs).
# Record the JAX and Flax suites under jax 0.8.3, then check them under 0.9.2 and 0.10.2.
set -u
cd /work/main
STORE=/tmp/upgrade-runs/store
rm -rf $STORE
for env in jax083 jax09 main; do
  if [ $env = main ]; then PY=/work/main/.venv/bin/python; else PY=/tmp/$env/bin/python; fi
  if [ $env = jax083 ]; then MODE=--accelperf-update; else MODE=; fi
  echo "== $env $(uptime)"
  start=$(date +%s)
  $PY -m pytest suites/jax/test_mesh_sweep.py suites/flax -p no:cacheprovider --accel=cpu \
     --accelperf-baselines=$STORE $MODE --accelperf-json=/tmp/upgrade-runs/$env.json \
     --accelperf-markdown=/tmp/upgrade-runs/$env.md --accelperf-explain=off -q > /tmp/upgrade-runs/$env.log 2>&1
  echo "rc=$? $(( $(date +%s) - start )) s $(uptime)"
done
