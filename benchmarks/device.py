"""One prepared run on a device (issue 38): four phases, each bounded in time, each written
to ``benchmarks/results/device-<device>-<time>.json`` as soon as it ends, so that a run cut
short keeps the figures of the phases it finished.

    python benchmarks/device.py --accel=gpu            # at most 8 minutes on one GPU
    python benchmarks/device.py --accel=cpu --quick    # the same script, small, for CI

Phases (``--phases`` picks some, in this order):

``suites``
    The repository's suites on the device: one session records baselines into a scratch
    store (``--accelperf-update``), a second is checked against it. Per session: the
    outcome counts, every check's verdict counts, and what skipped and why.
``noise``
    The spread of the step time of a JAX step and a torch step (an MLP each), within one
    process (the steps' IQR over their median) and between processes (the spread of the
    processes' medians), timed by the host's clock around a synchronized step and, where
    the device has one, by the device's own clock (CUDA events around the torch step;
    JAX exposes no event API, and the CPU has no device clock: said so).
``ab``
    A/B mode (``--accelperf-compare=HEAD``) in a scratch repository whose working tree makes
    each case's step slower by a planted fraction (``ACCELPERF_INJECT_SLOWDOWN``, as
    ``gate.py ab`` plants it): 0 (A/A), 2 % and 5 %, for a JAX case and a torch case. False
    verdicts, detection rates and the smallest detectable change at the budget.
``determinism``
    The program records (torch's eager program, XLA's compiled program) taken by two
    separate sessions: they must be identical; the keys that differ are listed.

A device that is asked for and not there ends the script with one line naming what was
looked for (the plugin's own message), exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import gate  # noqa: E402  (benchmarks/gate.py: its A/B result rows and git helper)

from pytest_accelperf.interrupt import sigint_delivered  # noqa: E402

#: Seconds per phase on a device, and in --quick mode (each phase stops at its bound and
#: writes what it has). The device's add up to 7.5 minutes, under the 8 the issue allows.
BUDGETS = {"suites": 150.0, "noise": 60.0, "ab": 180.0, "determinism": 60.0}
QUICK_BUDGETS = {"suites": 90.0, "noise": 45.0, "ab": 120.0, "determinism": 60.0}
PHASES = tuple(BUDGETS)


# --------------------------------------------------------------------------------------
# The device


def device_kind(accel: str) -> str:
    """The device's name as the plugin describes it (``NVIDIA H100 80GB HBM3``, ``cpu``);
    raises SystemExit with the plugin's one line when it is not there."""
    if accel == "cpu":
        return "cpu"
    from pytest_accelperf.provision.accel import AcceleratorUnavailable, provision

    try:
        return str(provision(accel, 1).device_kind)
    except AcceleratorUnavailable as exc:
        print(f"device.py: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


class Results:
    """The run's JSON file, rewritten whole (atomically) after every phase."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {**header, "phases": {}}
        self.write()

    def phase(self, name: str, figures: dict[str, Any]) -> None:
        self.data["phases"][name] = figures
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n",
                       encoding="utf-8")
        tmp.replace(self.path)


def load() -> list[float]:
    with contextlib.suppress(OSError):
        return [round(x, 2) for x in os.getloadavg()]
    return []


def pytest_session(cwd: Path, args: Sequence[str], env: dict[str, str], timeout: float,
                   log: Path) -> tuple[int | None, str, float]:
    """``pytest ARGS`` in ``cwd``; past ``timeout`` it is interrupted (SIGINT: pytest still
    writes its reports), then killed. Returns (exit status or None, output, seconds)."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", *args]
    t0 = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        with sigint_delivered():  # the session handles the SIGINT that bounds it
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
        try:
            rc: int | None = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = None
    return rc, log.read_text(encoding="utf-8", errors="replace"), time.monotonic() - t0


def base_env(accel: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "ACCELPERF_INJECT"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


_SKIP = re.compile(r"^SKIPPED \[(\d+)\] ([^:]+:\d+): (.*)$", re.M)
_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|error|errors|xfailed|deselected)")


def outcome_counts(output: str) -> dict[str, int]:
    """pytest's last summary line as counts."""
    lines = [ln for ln in output.splitlines() if re.search(r" in [\d.]+s", ln)]
    counts: dict[str, int] = {}
    for n, what in _COUNTS.findall(lines[-1] if lines else ""):
        counts["errors" if what == "error" else what] = int(n)
    return counts


def skipped(output: str) -> list[dict[str, Any]]:
    return [{"count": int(n), "where": where, "why": why}
            for n, where, why in _SKIP.findall(output)]


def report_cases(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    cases: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["cases"]
    return cases


# --------------------------------------------------------------------------------------
# (a) suites


def phase_suites(ns: argparse.Namespace, scratch: Path, budget: float) -> dict[str, Any]:
    targets = (["suites/torch/test_torch_gpt.py", "-k",
                "test_torch_gpt and b8 and not compiled and not maxbatch"] if ns.quick
               else ["suites/"])
    store = scratch / "suites-baselines"
    env = base_env(ns.accel)
    out: dict[str, Any] = {"targets": targets, "sessions": {}}
    t0 = time.monotonic()
    for name, extra in (("record", ["--accelperf-update"]), ("check", [])):
        left = budget - (time.monotonic() - t0)
        report = scratch / f"suites-{name}.json"
        args = [*targets, f"--accel={ns.accel}", f"--accelperf-baselines={store}",
                f"--accelperf-json={report}", *extra]
        rc, output, took = pytest_session(REPO, args, env, left, scratch / f"suites-{name}.txt")
        verdicts: Counter[str] = Counter()
        for case in report_cases(report):
            for check in case.get("checks") or []:
                verdicts[f"{check.get('metric')}: {check.get('verdict')}"] += 1
            if case.get("error"):
                verdicts["case error"] += 1
        out["sessions"][name] = {
            "exit": rc, "timed_out": rc is None, "seconds": round(took, 1),
            "outcomes": outcome_counts(output), "verdicts": dict(sorted(verdicts.items())),
            "cases": len(report_cases(report)), "skipped": skipped(output),
            "errors": [f"{c['case_id']}: {c['error']}"[:300] for c in report_cases(report)
                       if c.get("error")]}
        if rc is None:
            break
    return out


# --------------------------------------------------------------------------------------
# (b) timing noise: one child process per sample of the process level

NOISE_CHILD = "--noise-child"
#: The noise phase's MLP (input width, hidden width; batch 256, 8 outputs), and --quick's:
#: on the CPU the full one's 200 steps are minutes, and --quick checks that the phase runs
#: and writes its figures (its processes' start dominates a small one).
NOISE_WIDTHS = (512, 1024)
QUICK_NOISE_WIDTHS = (64, 128)


def _spread(times: Sequence[float]) -> dict[str, float]:
    q = statistics.quantiles(times, n=4)
    med = statistics.median(times)
    return {"median_ms": round(med * 1e3, 4), "iqr_over_median": round((q[2] - q[0]) / med, 4),
            "cv": round(statistics.stdev(times) / statistics.mean(times), 4),
            "min_ms": round(min(times) * 1e3, 4), "n": len(times)}


def noise_child(accel: str, framework: str, steps: int,
                widths: tuple[int, int] = NOISE_WIDTHS) -> dict[str, Any]:
    """Time ``steps`` synchronized steps of an MLP training step in this process: input
    width, two hidden layers of the hidden width (``widths``), 8 outputs, batch 256."""
    din, hidden = widths
    host: list[float] = []
    device: list[float] = []
    note = ""
    if framework == "jax":
        if accel == "cpu":
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax as jax_module
        import jax.numpy as jnp

        jax: Any = jax_module  # untyped in places (block_until_ready)

        dev = jax.devices("gpu" if accel == "gpu" else "cpu")[0]
        key = jax.random.PRNGKey(0)
        params = [jax.device_put(jax.random.normal(k, s) * 0.05, dev) for k, s in zip(
            jax.random.split(key, 3), ((din, hidden), (hidden, hidden), (hidden, 8)),
            strict=True)]
        x = jax.device_put(jnp.ones((256, din)), dev)

        def loss(ps: Any, xb: Any) -> Any:
            h = xb
            for w in ps[:-1]:
                h = jnp.tanh(h @ w)
            return jnp.mean((h @ ps[-1]) ** 2)

        def sgd(ps: Any, xb: Any) -> Any:
            grads = jax.grad(loss)(ps, xb)
            return [p - 0.01 * g for p, g in zip(ps, grads, strict=True)]

        step = jax.jit(sgd)

        for _ in range(5):
            params = jax.block_until_ready(step(params, x))
        for _ in range(steps):
            t = time.perf_counter()
            params = jax.block_until_ready(step(params, x))
            host.append(time.perf_counter() - t)
        note = ("no device clock: JAX has no event API (a profiler trace would have it)"
                if accel == "gpu" else "no device clock on the CPU")
    else:
        import torch

        events: Any = torch.cuda  # Event is untyped
        dev_t = torch.device("cuda" if accel == "gpu" else "cpu")
        model = torch.nn.Sequential(torch.nn.Linear(din, hidden), torch.nn.Tanh(),
                                    torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
                                    torch.nn.Linear(hidden, 8)).to(dev_t)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        xt = torch.ones(256, din, device=dev_t)

        def tstep() -> None:
            opt.zero_grad(set_to_none=True)
            (model(xt) ** 2).mean().backward()
            opt.step()

        cuda = accel == "gpu"
        for _ in range(5):
            tstep()
        if cuda:
            torch.cuda.synchronize()
        for _ in range(steps):
            if cuda:
                start = events.Event(enable_timing=True)
                end = events.Event(enable_timing=True)
                start.record()
            t = time.perf_counter()
            tstep()
            if cuda:
                end.record()
                torch.cuda.synchronize()
            host.append(time.perf_counter() - t)
            if cuda:
                device.append(start.elapsed_time(end) / 1e3)
        note = "CUDA events around the step" if cuda else "no device clock on the CPU"
    return {"host": _spread(host), "device": _spread(device) if device else None,
            "device_clock": note}


def phase_noise(ns: argparse.Namespace, scratch: Path, budget: float) -> dict[str, Any]:
    processes, steps = (2, 20) if ns.quick else (4, 200)
    widths = QUICK_NOISE_WIDTHS if ns.quick else NOISE_WIDTHS
    out: dict[str, Any] = {"processes": processes, "steps": steps, "widths": list(widths)}
    t0 = time.monotonic()
    for framework in ("jax", "torch"):
        per: list[dict[str, Any]] = []
        for _ in range(processes):
            left = budget - (time.monotonic() - t0)
            if left <= 5:
                break
            try:
                done = subprocess.run(
                    [sys.executable, __file__, NOISE_CHILD, ns.accel, framework, str(steps),
                     *map(str, widths)],
                    capture_output=True, text=True, timeout=left, env=base_env(ns.accel),
                    check=False)
            except subprocess.TimeoutExpired:
                break
            if done.returncode != 0:
                per.append({"error": done.stderr.strip().splitlines()[-1:]})
                continue
            per.append(json.loads(done.stdout.strip().splitlines()[-1]))
        good = [p for p in per if "host" in p]
        entry: dict[str, Any] = {"per_process": per}
        for clock in ("host", "device"):
            meds = [p[clock]["median_ms"] for p in good if p.get(clock)]
            if len(meds) >= 2:
                entry[f"{clock}_between_processes"] = {
                    "sd_of_medians_over_mean": round(statistics.stdev(meds)
                                                     / statistics.mean(meds), 4),
                    "range_over_min": round((max(meds) - min(meds)) / min(meds), 4)}
                entry[f"{clock}_within_process_iqr_over_median"] = round(statistics.median(
                    p[clock]["iqr_over_median"] for p in good if p.get(clock)), 4)
        entry["device_clock"] = good[0]["device_clock"] if good else None
        out[framework] = entry
    return out


# --------------------------------------------------------------------------------------
# (c) A/B mode: A/A and planted slowdowns

AB_TEST = '''
"""The device run's A/B cases: one per (framework, slowdown, repetition); the working tree's
slowdowns.py makes each case's step that much slower, the base revision's has 0."""
import dataclasses
import os

from slowdowns import ORDER, REPS, SLOWDOWN
from steptask import CASE as JAX_CASE, make_task as jax_task
from pytest_accelperf import cases

ACCELS = ({accel!r},)
JAX = [dataclasses.replace(JAX_CASE, accels=ACCELS, steps=10, label=f"{{n}}-r{{r}}")
       for r in range(REPS) for n in ORDER]


def _plant(case):
    os.environ["ACCELPERF_INJECT_SLOWDOWN"] = repr(SLOWDOWN[case.label.split("-")[0]])


@cases(*JAX)
def test_jax(accelperf):
    _plant(accelperf.case)
    accelperf.train(jax_task(accelperf.case))
'''

#: The torch cases of the A/B phase, after :data:`AB_TEST` (not in --quick).
AB_TORCH = '''

import torch

from pytest_accelperf import Case
from pytest_accelperf.torch import TorchTask

TORCH = [Case(backend="torch", batch=256, steps=10, warmup=3, accels=ACCELS,
              label=f"{n}-r{r}") for r in range(REPS) for n in ORDER]


def torch_task(case):
    def make_batch(step):
        g = torch.Generator().manual_seed(step)
        return torch.randn(case.batch, 512, generator=g)

    return TorchTask(
        make_model=lambda: torch.nn.Sequential(
            torch.nn.Linear(512, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 1024),
            torch.nn.Tanh(), torch.nn.Linear(1024, 8)),
        loss_fn=lambda model, x: (model(x) ** 2).mean(), make_batch=make_batch,
        make_optimizer=lambda p: torch.optim.SGD(p, lr=0.01))


@cases(*TORCH)
def test_torch(accelperf):
    _plant(accelperf.case)
    accelperf.train(torch_task(accelperf.case))
'''


def ab_repo(root: Path, accel: str, slowdowns: Sequence[float], reps: int,
            frameworks: Sequence[str] = ("jax", "torch")) -> None:
    names = [gate._slowdown_name(f) for f in slowdowns]
    root.mkdir(parents=True)
    shutil.copy(HERE / "suite" / "steptask.py", root / "steptask.py")
    (root / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\naddopts = \"-p no:cacheprovider\"\n", encoding="utf-8")
    source = AB_TEST.format(accel=accel) + (AB_TORCH if "torch" in frameworks else "")
    (root / "test_ab.py").write_text(textwrap.dedent(source))

    def module(values: Sequence[float]) -> str:
        table = ", ".join(f"{n!r}: {v!r}" for n, v in zip(names, values, strict=True))
        return f"ORDER = {names!r}\nREPS = {reps}\nSLOWDOWN = {{{table}}}\n"

    (root / "slowdowns.py").write_text(module([0.0] * len(slowdowns)))
    gate._git(root, "init", "-q")
    gate._git(root, "add", "-A")
    gate._git(root, "commit", "-qm", "base: no slowdown")
    (root / "slowdowns.py").write_text(module(slowdowns))


def phase_ab(ns: argparse.Namespace, scratch: Path, budget: float) -> dict[str, Any]:
    slowdowns = [0.0, 0.05] if ns.quick else [0.0, 0.02, 0.05]
    reps = 1 if ns.quick else 2
    case_budget = 2.0 if ns.quick else 8.0
    processes = 1 if ns.quick else 2
    # --quick: the fewest rounds a paired interval takes (A/B mode's default is 10); on a
    # loaded CPU 10 rounds of the two MLPs ran 17-26 s a case, past the 2 s budget.
    rounds = 3 if ns.quick else 10
    # --quick: the JAX cases only (a torch case is two more runs and two more steps built
    # per slowdown; tests/e2e/test_ab_mode.py compares torch cases).
    frameworks = ("jax",) if ns.quick else ("jax", "torch")
    repo = scratch / "ab-repo"
    ab_repo(repo, ns.accel, slowdowns, reps, frameworks)
    report = scratch / "ab.json"
    env = base_env(ns.accel)
    env[gate.STEPS_ENV] = "10"
    args = ["test_ab.py", f"--accel={ns.accel}", "--accelperf-cpu-devices=1",
            "--accelperf-compare=HEAD", f"--accelperf-json={report}",
            "--accelperf-compare-tolerance=0.01", f"--accelperf-compare-budget={case_budget:g}",
            f"--accelperf-compare-processes={processes}",
            f"--accelperf-compare-rounds={rounds}",
            f"--accelperf-compare-prepare-timeout={min(120.0, budget):g}"]
    load0 = load()
    rc, output, took = pytest_session(repo, args, env, budget, scratch / "ab.txt")
    rows = []
    for case in report_cases(report):
        row = gate.ab_case_result(case, slowdowns)
        row["framework"] = case["case_id"].split("-", 1)[0]
        for key in ("blocks", "pairs", "rounds_only"):
            row.pop(key, None)
        rows.append(row)
    summary: list[dict[str, Any]] = []
    for framework in sorted({r["framework"] for r in rows}):
        for s in slowdowns:
            mine = [r for r in rows if r["framework"] == framework and r["slowdown"] == s]
            if not mine:
                continue
            verdicts = Counter(r["verdict"] for r in mine)
            mdcs = [abs(r["ci"][1] - r["ci"][0]) / 2 / r["ratio"] for r in mine
                    if r.get("ci") and r.get("ratio")]
            summary.append({
                "framework": framework, "slowdown": s, "cases": len(mine),
                "verdicts": dict(verdicts),
                "false_verdicts": (sum(n for v, n in verdicts.items()
                                       if v not in ("pass", "inconclusive")) if s == 0
                                   else None),
                "detected": verdicts.get("regression", 0) if s else None,
                "ratios": [r["ratio"] for r in mine],
                "smallest_detectable_change_median": (round(statistics.median(mdcs), 4)
                                                      if mdcs else None)})
    return {"exit": rc, "timed_out": rc is None, "seconds": round(took, 1),
            "load_before": load0, "load_after": load(), "slowdowns": slowdowns,
            "reps": reps, "budget_per_case_s": case_budget, "process_pairs": processes,
            "fewest_rounds": rounds, "frameworks": list(frameworks),
            "outcomes": outcome_counts(output), "summary": summary, "cases": rows,
            "tail": output[-1500:] if not rows else ""}


# --------------------------------------------------------------------------------------
# (d) determinism: the program records of two sessions

DET_TEST = '''
import torch

from steptask import CASE as JAX_CASE, make_task as jax_task
from pytest_accelperf import Case, cases
from pytest_accelperf.torch import TorchTask
import dataclasses

ACCELS = ({accel!r},)


@cases(dataclasses.replace(JAX_CASE, accels=ACCELS, steps=5, warmup=2, label="det"))
def test_xla(accelperf):
    accelperf.train(jax_task(accelperf.case))


@cases(Case(backend="torch", batch=64, steps=5, warmup=2, accels=ACCELS, label="det"))
def test_torch_eager(accelperf):
    accelperf.train(TorchTask(
        make_model=lambda: torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                               torch.nn.Linear(128, 4)),
        loss_fn=lambda m, b: (m(b) ** 2).mean(),
        make_batch=lambda step: torch.randn(64, 64, generator=torch.Generator().manual_seed(step)),
        make_optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3)))
'''


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _diff(a.get(k), b.get(k),
                                                                 f"{path}/{k}")]
    return [] if a == b else [path or "/"]


def phase_determinism(ns: argparse.Namespace, scratch: Path, budget: float) -> dict[str, Any]:
    root = scratch / "det"
    root.mkdir()
    shutil.copy(HERE / "suite" / "steptask.py", root / "steptask.py")
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n", encoding="utf-8")
    (root / "test_det.py").write_text(textwrap.dedent(DET_TEST.format(accel=ns.accel)))
    env = base_env(ns.accel)
    env[gate.STEPS_ENV] = "5"
    takes: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for take in range(2):
        report = scratch / f"det-{take}.json"
        args = ["test_det.py", f"--accel={ns.accel}", "--accelperf-cpu-devices=1",
                "--accelperf-update", f"--accelperf-baselines={scratch / f'det-b{take}'}",
                f"--accelperf-json={report}", "--accelperf-explain=off"]
        left = budget - (time.monotonic() - t0)
        rc, _, _ = pytest_session(root, args, env, left, scratch / f"det-{take}.txt")
        takes.append({c["case_id"]: (c.get("run") or {}).get("program")
                      for c in report_cases(report)})
        if rc is None:
            break
    out: dict[str, Any] = {"cases": {}}
    ids: set[str] = set()
    for take_records in takes:
        ids.update(take_records)
    for case_id in sorted(ids):
        records = [t.get(case_id) for t in takes]
        if len(records) < 2 or any(r is None for r in records):
            out["cases"][case_id] = {"identical": None, "why": "a take has no program record"}
            continue
        differs = _diff(records[0], records[1])
        out["cases"][case_id] = {"identical": not differs, "differing_keys": differs[:20],
                                 "keys": sorted(records[0] or {})}
    return out


# --------------------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[argparse.Namespace, Path, float], dict[str, Any]]] = {
    "suites": phase_suites, "noise": phase_noise, "ab": phase_ab,
    "determinism": phase_determinism}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [NOISE_CHILD]:
        accel, framework, steps = args[1], args[2], int(args[3])
        din, hidden = map(int, args[4:6] or NOISE_WIDTHS)
        print(json.dumps(noise_child(accel, framework, steps, (din, hidden))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--accel", choices=("cpu", "gpu"), default="gpu")
    p.add_argument("--quick", action="store_true",
                   help="a small run of every phase (for CI on the CPU)")
    p.add_argument("--phases", default=",".join(PHASES),
                   help=f"comma-separated, of {', '.join(PHASES)} (default: all)")
    p.add_argument("--phase-budget", type=float, default=None,
                   help="seconds per phase, overriding the defaults (device: "
                        + ", ".join(f"{k} {v:g}" for k, v in BUDGETS.items()) + ")")
    p.add_argument("--out", default=str(HERE / "results"), help="folder of the JSON file")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="copy the scratch folder (the suites' baselines, reports and session "
                        "logs) to DIR before it is removed")
    ns = p.parse_args(args)
    phases = [x for x in ns.phases.split(",") if x]
    unknown = [x for x in phases if x not in PHASES]
    if unknown:
        p.error(f"--phases: unknown {', '.join(unknown)}; known: {', '.join(PHASES)}")
    kind = device_kind(ns.accel)
    budgets = dict(QUICK_BUDGETS if ns.quick else BUDGETS)
    if ns.phase_budget is not None:
        budgets = {k: float(ns.phase_budget) for k in budgets}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(ns.out) / f"device-{slug(kind)}-{stamp}.json"
    results = Results(path, {
        "command": "python " + " ".join(["benchmarks/device.py", *args]),
        "accel": ns.accel, "device": kind, "quick": ns.quick, "started": stamp,
        "machine": gate._machine(), "budgets_s": {k: budgets[k] for k in phases},
        "commit": os.environ.get("ACCELPERF_DEVICE_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
            check=False).stdout.strip()})
    scratch = Path(tempfile.mkdtemp(prefix="accelperf-device-"))
    try:
        for name in phases:
            t0 = time.monotonic()
            load0 = load()
            try:
                figures = RUNNERS[name](ns, scratch, budgets[name])
            except KeyboardInterrupt:
                results.phase(name, {"interrupted": True})
                raise
            except Exception as exc:  # one phase's failure does not cost the others
                figures = {"error": f"{type(exc).__name__}: {exc}"}
            figures.update(wall_s=round(time.monotonic() - t0, 1), load_before=load0,
                           load_after=load())
            results.phase(name, figures)
            print(f"{name}: {figures['wall_s']} s, written to {path}", flush=True)
    finally:
        if ns.keep:
            shutil.copytree(scratch, ns.keep, dirs_exist_ok=True, ignore_dangling_symlinks=True)
        shutil.rmtree(scratch, ignore_errors=True)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
