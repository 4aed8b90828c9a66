#!/usr/bin/env python
"""The Hugging Face Trainer trial: transformers' language-modelling example (``run_clm.py``'s
model-from-config path, ``group_texts``, ``default_data_collator`` and its
``TrainingArguments`` parsed by ``HfArgumentParser``) under the gate, unchanged and with
the regressions its users hit planted.

::

    python benchmarks/hf_clm.py [--plain 2] [--plants checkpointing,eager,bf16_off]
                                [--out DIR] [--keep]

copies ``benchmarks/hf_clm_suite/`` to a scratch directory (its own rootdir and
``baselines/``), records the case's baseline there (``--accelperf-update``), then runs
``--plain`` unchanged sessions and one session of each planted regression
(``ACCELPERF_HF_PLANT``, see the suite's module docstring), each a pytest process with
``--accelperf-json``. Prints, per session, every check's verdict and the message of each
regression, and writes them to ``--out``/``hf_clm.json``. Needs transformers, accelerate
and tokenizers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SUITE = HERE / "hf_clm_suite"
#: Checks that read no clock: their verdict does not depend on the machine's timing.
CLOCKLESS = ("outcome", "loss", "lr", "program", "memory", "numerics")


def session(workdir: Path, plant: str, *extra: str) -> dict[str, Any]:
    """One pytest session of the suite with ``plant``: its checks' verdicts."""
    report = workdir / f"report-{plant}-{time.monotonic_ns()}.json"
    env = dict(os.environ, ACCELPERF_HF_PLANT=plant, OMP_NUM_THREADS="1")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "test_run_clm.py",
                           f"--accelperf-json={report}", *extra], cwd=workdir, env=env,
                          capture_output=True, text=True, check=False)
    out: dict[str, Any] = {"plant": plant, "rc": proc.returncode,
                           "wall_s": round(time.monotonic() - started, 1),
                           "load": os.getloadavg()[0], "checks": {}}
    if not report.is_file():
        out["error"] = (proc.stdout + proc.stderr)[-2000:]
        return out
    for case in json.loads(report.read_text(encoding="utf-8")).get("cases") or []:
        for check in case.get("checks") or []:
            out["checks"][check["metric"]] = {"verdict": check.get("verdict"),
                                              "detail": check.get("detail")}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", type=int, default=2)
    parser.add_argument("--plants", default="checkpointing,eager,bf16_off")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--keep", action="store_true")
    ns = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="accelperf-hf-clm-"))
    shutil.copytree(SUITE, workdir, dirs_exist_ok=True)
    try:
        recorded = session(workdir, "none", "--accelperf-update")
        sessions = [session(workdir, "none") for _ in range(ns.plain)]
        sessions += [session(workdir, plant) for plant in ns.plants.split(",") if plant]
    finally:
        if not ns.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    for s in [recorded, *sessions]:
        verdicts = {m: c["verdict"] for m, c in s["checks"].items()}
        print(f"{s['plant']:>14}  rc={s['rc']}  load={s['load']:.1f}  {s['wall_s']} s  "
              f"{verdicts}")
        for metric, check in s["checks"].items():
            if check["verdict"] == "regression":
                clock = "clockless" if metric in CLOCKLESS else "clock"
                print(f"{'':>16}{metric} ({clock}): {check['detail']}")
        if "error" in s:
            print(s["error"])
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "hf_clm.json").write_text(json.dumps({"recorded": recorded,
                                                    "sessions": sessions}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
