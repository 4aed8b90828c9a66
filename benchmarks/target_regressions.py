#!/usr/bin/env python
"""The gate on a compile-only target: false alarms over repeated compiles of the same code,
and which program regressions it catches in the TPU's program.

::

    python benchmarks/target_regressions.py [--target tpu-v5e:2x4] [--repeats 5] [--out DIR]

Needs libtpu (``pip install 'pytest-accelperf[tpu-aot]'``). A two-layer MLP, ``relu(x @ w1)
@ w2`` trained by SGD, Megatron-sharded over a 4x2 mesh (``w1`` by columns, ``w2`` by rows
over ``model``, the batch over ``data``), is compiled for the target through the JAX
backend as ``--accelperf-target`` compiles it (no step runs), once as the baseline. Then,
each compiled afresh in the same process: ``--repeats`` unchanged compiles, and one compile
of each regression a pull request could bring:

* ``lost_sharding``: ``w2`` replicated instead of split over ``model``;
* ``precision``: the step traced under ``jax.default_matmul_precision("highest")``;
* ``extra_matmul``: one more ``@ w2`` in the loss;
* ``host_callback``: a ``jax.debug.callback`` left in the loss;
* ``wider``: the hidden layer 512 -> 640 wide.

Each is checked against the baseline by the plugin's own checks (``run_checks``: outcome,
program, memory; the compile time too, whose verdict is printed but is not the subject).
It writes every trial to ``DIR/target-<time>.json`` and the table to ``DIR/target-<time>.md``
(default ``DIR``: ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_accelperf.provision.accel import prepare_environment

prepare_environment("cpu", 8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402

from pytest_accelperf.backends.jax.backend import BACKEND  # noqa: E402
from pytest_accelperf.checks import run_checks  # noqa: E402
from pytest_accelperf.checks.summary import summarize  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.jax import JaxStep  # noqa: E402
from pytest_accelperf.provision.targets import parse_target, provision_target  # noqa: E402
from pytest_accelperf.records.verdict import Tolerances  # noqa: E402

P: Any = PartitionSpec  # untyped in jax
REGRESSIONS = ("lost_sharding", "precision", "extra_matmul", "host_callback", "wider")
B, D = 256, 512


def mlp(change: str = "none") -> JaxStep:
    """The MLP, with ``change`` (one of :data:`REGRESSIONS`, or ``none``)."""
    hidden = 640 if change == "wider" else D

    def init(key: Any) -> dict[str, Any]:
        k1, k2 = jax.random.split(key)
        return {"w1": jax.random.normal(k1, (D, hidden)) * 0.05,
                "w2": jax.random.normal(k2, (hidden, D)) * 0.05}

    def loss(p: dict[str, Any], b: dict[str, Any]) -> Any:
        y = jax.nn.relu(b["x"] @ p["w1"]) @ p["w2"]
        if change == "extra_matmul":
            y = y + (jax.nn.relu(b["x"] @ p["w1"]) @ p["w2"]) * 0.5
        if change == "host_callback":
            jax.debug.callback(lambda v: None, y.sum())
        return jnp.mean((y - b["y"]) ** 2)

    def step(p: dict[str, Any], b: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if change == "precision":
            with jax.default_matmul_precision("highest"):
                value, grads = jax.value_and_grad(loss)(p, b)
        else:
            value, grads = jax.value_and_grad(loss)(p, b)
        return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), {"loss": value}

    w2 = P() if change == "lost_sharding" else P("model", None)
    return JaxStep(init=init, step=step, state_specs={"w1": P(None, "model"), "w2": w2},
                   make_batch=lambda i: {"x": np.ones((B, D), np.float32),
                                         "y": np.ones((B, D), np.float32)})


def trial(accel: Any, case: Case, change: str, baseline: dict[str, Any] | None,
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Compile ``change`` and check it against ``baseline``: the trial, and its block."""
    t0 = time.perf_counter()
    run = BACKEND.train(case, mlp(change), accel).run
    seconds = time.perf_counter() - t0
    block = summarize(run).to_json()
    checks = run_checks(run, block, baseline, Tolerances()) if baseline else []
    by = {c.metric: c for c in checks}
    return {
        "change": change, "seconds": round(seconds, 2), "outcome": run.outcome,
        "verdicts": {m: c.verdict.value for m, c in by.items()},
        "program": by["program"].detail if "program" in by else "",
        "memory": by["memory"].detail if "memory" in by else "",
        "collectives": run.program.get("collectives") if run.program else None,
    }, block


def table(trials: list[dict[str, Any]], target: str, load: str) -> str:
    unchanged = [t for t in trials if t["change"] == "none"]
    false = sum(1 for t in unchanged if any(
        t["verdicts"].get(m) == "regression" for m in ("outcome", "program", "memory")))
    lines = [f"# The program check on {target}, compile-only",
             "", f"{_dt.datetime.now().isoformat(timespec='seconds')}; {load}", "",
             f"Unchanged compiles: {len(unchanged)}, false alarms (outcome, program or "
             f"memory a regression): {false}.", "",
             "| regression | program | memory | what the program check says |",
             "|---|---|---|---|"]
    for t in trials:
        if t["change"] != "none":
            lines.append(f"| {t['change']} | {t['verdicts'].get('program')} | "
                         f"{t['verdicts'].get('memory')} | {t['program']} |")
    lines += ["", "| compile | seconds |", "|---|---|"]
    lines += [f"| {t['change']} | {t['seconds']} |" for t in trials]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="tpu-v5e:2x4")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    accel = provision_target(parse_target(args.target))
    case = Case(backend="jax", batch=B, mesh=(4, 2))
    first, baseline = trial(accel, case, "none", None)
    trials = []
    for change in ["none"] * args.repeats + list(REGRESSIONS):
        trials.append(trial(accel, case, change, baseline)[0])
        print(f"{change}: {trials[-1]['verdicts']}", flush=True)
    load = f"load average {os.getloadavg()[0]:.2f} at the end"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"target-{stamp}.json").write_text(json.dumps(
        {"target": args.target, "baseline": first, "trials": trials, "load": load}, indent=1))
    text = table(trials, args.target, load)
    (out / f"target-{stamp}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
