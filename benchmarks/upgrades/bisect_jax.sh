#!/bin/bash
# accelperf bisect over jax's releases on a case whose program changed across 0.8.3 -> 0.9.2
cd /work/main
source .venv/bin/activate
export ACCELPERF_ENV_CACHE=/tmp/accelperf-envs
echo "== start $(uptime)"
start=$(date +%s)
accelperf bisect --package jax 0.8.3 0.10.2 --json /tmp/upgrade-runs/bisect.json -- \
  "suites/jax/test_mesh_sweep.py::test_mesh_sweep[jax-nomesh-b64]" --accel=cpu > /tmp/upgrade-runs/bisect.log 2>&1
echo "rc=$? $(( $(date +%s) - start )) s $(uptime)"
