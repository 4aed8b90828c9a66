#!/usr/bin/env python
"""``accelperf bisect`` on a 16-commit repository (issue 27, part 2): comparisons used and
wall time, for a program-visible regression and for timing-only ones.

::

    python benchmarks/bisect_commits.py [--scenarios program,sleep20,sleep5] [--at 11] [--budget 20]
                                [--max-foreign-load 0.25] [--out DIR]

Each scenario builds a throwaway git repository in a temporary directory (:func:`build`):
a tiny suite (one case) at GOOD, then 16 commits, each touching ``history.txt``, one of
which (``--at``, 1..16) plants the regression:

* ``program``: the hidden layer of the JAX MLP 64 -> 256 wide (FLOPs and bytes up: the
  program record sees it, so the search is on the record);
* ``sleepNN``: a ``time.sleep`` in the forward pass of an eager torch MLP, NN % of its
  fastest step as measured on this machine just before (a one-commit copy of the suite
  timed first, :func:`calibrate`): no op, byte or sync changes, so the programs agree and
  the search is on A/B timing (``--budget`` seconds a comparison). What the sleep really
  adds is what A/B mode measures at BAD (the table's "BAD measured"): one session's
  fastest step is no steady figure on a loaded machine, so the fraction is nominal.

``accelperf bisect GOOD BAD -- test_suite.py`` then runs in it as a user would (``python -m
pytest_accelperf.cli``, this checkout's plugin), and the result (``--json``), its exit
status, the wall time and the load average before and after are written to
``DIR/bisect-<time>.json`` with a Markdown table beside it. The target (issue 27):
⌈log2 16⌉ + 2 = 6 comparisons or fewer.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Commits in GOOD..BAD.
COMMITS = 16
#: The target of issue 27 for 16 commits: ceil(log2 16) + 2.
TARGET = math.ceil(math.log2(COMMITS)) + 2

JAX_MODEL = '''\
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from pytest_accelperf.jax import JaxTask

DIM = 64
HIDDEN = 64


def make_task(case):
    def init_params(key):
        import jax
        k1, k2 = jax.random.split(key)
        return {"w1": jax.random.normal(k1, (DIM, HIDDEN)) * 0.05,
                "w2": jax.random.normal(k2, (HIDDEN, 8)) * 0.05}

    def loss_fn(params, batch):
        import jax.numpy as jnp
        h = jnp.tanh(batch["x"] @ params["w1"])
        return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)

    def make_batch(step):
        x = np.random.default_rng(step).normal(size=(case.batch, DIM)).astype(np.float32)
        return {"x": x, "y": x[:, :8]}

    return JaxTask(init_params=init_params, loss_fn=loss_fn, make_batch=make_batch,
                   optimizer=optax.sgd(0.01), param_specs=lambda p: {"w1": P(), "w2": P()})
'''

JAX_SUITE = '''\
from model import make_task
from pytest_accelperf import cases


@cases(backend="jax", batch=[64], steps=3, warmup=1)
def test_step(accelperf):
    accelperf.train(make_task(accelperf.case))
'''

TORCH_MODEL = '''\
import time

import torch

from pytest_accelperf.torch import TorchTask

DIM = 256
HIDDEN = 1024
SLEEP = 0.0


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(DIM, HIDDEN)
        self.l2 = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x):
        if SLEEP:
            time.sleep(SLEEP)
        return self.l2(torch.tanh(self.l1(x)))


def make_task(case):
    def make_batch(step):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(case.batch, DIM, generator=g)
        return {"x": x, "y": x.sum(dim=1, keepdim=True)}

    def loss_fn(model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    return TorchTask(make_model=Net, loss_fn=loss_fn, make_batch=make_batch,
                     make_optimizer=lambda p: torch.optim.SGD(p, lr=1e-3))
'''

TORCH_SUITE = '''\
from model import make_task
from pytest_accelperf import cases


@cases(backend="torch", batch=[256], steps=20, warmup=2)
def test_step(accelperf):
    accelperf.train(make_task(accelperf.case))
'''

#: The suite's own settings: the CPU, one device, no baseline store of its own.
PYPROJECT = '''\
[tool.accelperf]
accel = "cpu"
cpu_devices = 1
'''

#: Options for the sessions here: the hypothesis plugin of the project's test environment
#: takes 2-3 s to import in every session, and the suite has no use for it.
PYTEST_ARGS: tuple[str, ...] = ("-p", "no:hypothesispytest")


def git(path: Path, *args: str) -> str:
    out = subprocess.run(["git", "-c", "user.email=bench@example.com", "-c", "user.name=bench",
                          "-c", "commit.gpgsign=false", *args], cwd=path, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def build(path: Path, *, framework: str, plant: tuple[str, str], at: int,
          broken: Sequence[int] = (), commits: int = COMMITS) -> list[str]:
    """A git repository in ``path`` (created): GOOD with the suite, then ``commits``
    commits; commit ``at`` (1-based) replaces ``plant[0]`` by ``plant[1]`` in
    ``model.py``; each commit of ``broken`` adds an import of a module that does not exist
    to ``model.py`` (its session does not collect) and the next commit takes it out.
    Returns the shas, GOOD first."""
    path.mkdir(parents=True, exist_ok=True)
    model = path / "model.py"
    model.write_text(JAX_MODEL if framework == "jax" else TORCH_MODEL)
    (path / "test_suite.py").write_text(JAX_SUITE if framework == "jax" else TORCH_SUITE)
    (path / "pyproject.toml").write_text(PYPROJECT)
    (path / ".gitignore").write_text("__pycache__/\n")
    history = path / "history.txt"
    history.write_text("GOOD\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "GOOD: the suite")
    shas = [git(path, "rev-parse", "HEAD")]
    old, new = plant
    for i in range(1, commits + 1):
        subject = f"commit {i}: touch history.txt"
        with history.open("a") as out:
            out.write(f"commit {i}\n")
        text = model.read_text()
        if "import nosuchmodule" in text:
            model.write_text(text.replace("import nosuchmodule\n", ""))
            subject = f"commit {i}: take the broken import out again"
        if i == at:
            assert old in text, (old, text)
            model.write_text(model.read_text().replace(old, new))
            subject = f"commit {i}: {old} -> {new} in model.py"
        if i in broken:
            model.write_text("import nosuchmodule\n" + model.read_text())
            subject = f"commit {i}: import a module that does not exist"
        git(path, "commit", "-qam", subject)
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas


def env() -> dict[str, str]:
    """This checkout's plugin first on the path, as the project's tests run it."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), path]))}


def calibrate(workdir: Path) -> float:
    """The fastest step time (seconds) of the torch suite at GOOD on this machine now:
    what A/B mode's statistic reads of a block (its fastest step), not the median, which
    a loaded machine inflates (16 ms once, 3 ms another time)."""
    repo = workdir / "calibrate"
    build(repo, framework="torch", plant=("SLEEP = 0.0", "SLEEP = 0.0"), at=1, commits=1)
    report = workdir / "calibrate.json"
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *PYTEST_ARGS,
                    "test_suite.py", f"--accelperf-json={report}", "--accelperf-explain=off",
                    "-q"], cwd=repo, env=env(), check=False, capture_output=True)
    case = json.loads(report.read_text())["cases"][0]
    return float(min(case["run"]["step_times"]))


def bisect(repo: Path, shas: list[str], out: Path, extra: Sequence[str] = (),
           pytest_args: Sequence[str] = PYTEST_ARGS) -> dict[str, Any]:
    """``accelperf bisect GOOD BAD -- test_suite.py`` in ``repo``: its result, exit status,
    wall time, output, and the load average before and after."""
    result = out.with_suffix(".json")
    argv = [sys.executable, "-m", "pytest_accelperf.cli", "bisect", *extra, "--json",
            str(result), shas[0], shas[-1], "--", "test_suite.py", *pytest_args]
    load_before = os.getloadavg()
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=repo, env=env(), capture_output=True, text=True,
                          check=False)
    wall = time.monotonic() - t0
    out.with_suffix(".txt").write_text(done.stdout + done.stderr)
    data = json.loads(result.read_text()) if result.exists() else None
    return {"exit_status": done.returncode, "wall_s": round(wall, 1),
            "load_before": load_before, "load_after": os.getloadavg(),
            "result": data, "stdout": done.stdout, "stderr": done.stderr[-2000:],
            "command": " ".join(argv[1:])}


def scenario(name: str, at: int, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    repo = workdir / name
    extra: list[str] = []
    facts: dict[str, Any] = {"scenario": name, "planted_at": at}
    if name == "program":
        shas = build(repo, framework="jax", plant=("HIDDEN = 64", "HIDDEN = 256"), at=at)
    else:
        fraction = int(name.removeprefix("sleep")) / 100
        step = calibrate(workdir / f"{name}-cal")
        sleep = fraction * step
        facts.update(fraction=fraction, calibrated_step_s=step, sleep_s=sleep)
        shas = build(repo, framework="torch", plant=("SLEEP = 0.0", f"SLEEP = {sleep:.6f}"),
                     at=at)
        extra = ["--budget", f"{args.budget:g}"]
    pytest_args = list(PYTEST_ARGS)
    if args.max_foreign_load is not None:
        pytest_args.append(f"--accelperf-max-foreign-load={args.max_foreign_load:g}")
        facts["max_foreign_load"] = args.max_foreign_load
    run = bisect(repo, shas, workdir / f"{name}-result", extra, pytest_args)
    found = (run["result"] or {}).get("first_bad") or {}
    facts.update(run, expected=shas[at], found=found.get("sha"),
                 correct=found.get("sha") == shas[at],
                 comparisons=(run["result"] or {}).get("comparisons"))
    return facts


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| scenario | BAD measured | planted at | found | comparisons (target ≤ 6) | "
             "exit | wall | load before → after |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        what = r["scenario"]
        if "fraction" in r:
            what += (f" (sleep {r['sleep_s'] * 1e3:.2f} ms = {r['fraction']:.0%} of a "
                     f"{r['calibrated_step_s'] * 1e3:.2f} ms step)")
        found = "yes" if r["correct"] else f"no ({(r['result'] or {}).get('message', '')})"
        steps = (r["result"] or {}).get("steps") or []
        at_bad = next((s["evidence"].split(" (", 1)[0] for s in steps
                       if s["position"] == 16 and s["call"] in ("bad", "good", "skip")
                       and s["kind"] == ("program" if r["scenario"] == "program" else "A/B")),
                      "-")
        lines.append(f"| {what} | {at_bad} | {r['planted_at']}/16 | {found} | "
                     f"{r['comparisons']} | "
                     f"{r['exit_status']} | {r['wall_s']:.0f} s | "
                     f"{r['load_before'][0]:.1f} → {r['load_after'][0]:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="program,sleep20,sleep5")
    parser.add_argument("--at", type=int, default=11, help="the commit (1..16) that plants it")
    parser.add_argument("--budget", type=float, default=20.0,
                        help="A/B seconds per comparison (accelperf bisect --budget)")
    parser.add_argument("--max-foreign-load", type=float, default=None,
                        help="passed to the sessions as --accelperf-max-foreign-load")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="accelperf-bisect-bench-") as tmp:
        for name in args.scenarios.split(","):
            row = scenario(name, args.at, Path(tmp), args)
            rows.append(row)
            print(f"{name}: exit {row['exit_status']}, correct {row['correct']}, "
                  f"{row['comparisons']} comparisons, {row['wall_s']} s", flush=True)
            print(textwrap.indent(row["stdout"], "  "), flush=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"bisect-{stamp}.json"
    out.write_text(json.dumps({
        "command": " ".join(["python", "benchmarks/bisect_commits.py",
                             *(argv or sys.argv[1:])]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "target_comparisons": TARGET, "rows": rows}, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(rows))
    print(markdown(rows))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
