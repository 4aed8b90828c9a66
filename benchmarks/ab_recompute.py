"""A/B results recomputed under the plugin's current statistic, from their stored rounds.

Every row that ``benchmarks/gate.py ab`` writes keeps its case's rounds (``blocks``: the
step times of each arm's block) and each round's process pair (``pairs``). This gives the
verdict that the statistic of the plugin imported here (``stats.ab_ratio`` and
``stats.ab_verdict``) reaches on the same rounds, beside the verdict as run, per
workload, load and slowdown: a change of the statistic is measured on the very rounds the
old one judged, with no new run and no difference of machine state between the two.

    python benchmarks/ab_recompute.py benchmarks/results/ab-*.json

Prints a Markdown table; ``--json PATH`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest
from tabulate import tabulate

from pytest_accelperf.stats.bootstrap import ab_ratio, ab_verdict


def _tolerance(command: str) -> float:
    words = command.split()
    if "--ab-tolerance" in words:
        return float(words[words.index("--ab-tolerance") + 1])
    return 0.01


def recompute(path: Path, max_foreign_load: float | None) -> list[dict[str, Any]]:
    """The rows of one results file, each with its verdict as run and ``now``; with
    ``max_foreign_load``, a ``regression`` or ``improvement`` measured while other processes
    used more cores than that becomes ``inconclusive`` (``guarded``), as the plugin's
    ``--accelperf-max-foreign-load`` does."""
    data = json.loads(path.read_text())
    tolerance = _tolerance(str(data.get("command", "")))
    rows = []
    for r in data["results"]:
        blocks = r.get("blocks") or {}
        if not blocks.get("base") or not r.get("pairs"):
            continue  # a case that never measured (an error): nothing to recompute
        est, spread = ab_ratio(blocks["head"], blocks["base"], r["pairs"])
        now = ab_verdict(est, tolerance).value
        foreign = r.get("foreign_cores")
        guarded = now
        if (max_foreign_load is not None and isinstance(foreign, (int, float))
                and foreign > max_foreign_load and now in ("regression", "improvement")):
            guarded = "inconclusive"
        rows.append({"file": path.name, "workload": r["workload"],
                     "load": r.get("load", "none"), "slowdown": r["slowdown"],
                     "as_run": r["verdict"], "now": now, "guarded": guarded,
                     "foreign_cores": foreign,
                     "ratio": est.ratio, "half_width": est.mdc,
                     "pairs": spread.processes if spread else 1})
    return rows


def _share(k: int, n: int) -> str:
    ci = binomtest(k, n).proportion_ci(method="wilson")
    return f"{k}/{n} [{ci.low:.0%}, {ci.high:.0%}]"


def table(rows: list[dict[str, Any]]) -> str:
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["workload"], r["load"], r["slowdown"])].append(r)
    out = []
    for (workload, load, slowdown), mine in sorted(groups.items()):
        n = len(mine)
        alarm = {"regression", "improvement", "error"} if slowdown == 0 else {"regression"}
        out.append([workload, load, f"{slowdown:.0%}", n,
                    _share(sum(r["as_run"] in alarm for r in mine), n),
                    _share(sum(r["now"] in alarm for r in mine), n),
                    _share(sum(r["guarded"] in alarm for r in mine), n),
                    ", ".join(f"{v} {sum(r['now'] == v for r in mine)}"
                              for v in sorted({r["now"] for r in mine})),
                    f"{float(np.median([r['ratio'] for r in mine])):.4f}",
                    f"{float(np.median([r['half_width'] for r in mine])):.2%}"])
    return tabulate(out, headers=["workload", "load", "slowdown", "cases",
                                  "alarms as run [95% CI]", "alarms now [95% CI]",
                                  "alarms now, load guard on",
                                  "verdicts now", "median ratio",
                                  "median half-width now"], tablefmt="github")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--max-foreign-load", type=float, default=0.25,
                        help="the plugin's --accelperf-max-foreign-load for the guarded "
                             "column (default 0.25, the plugin's)")
    ns = parser.parse_args(argv)
    rows = [row for path in ns.results for row in recompute(path, ns.max_foreign_load)]
    if not rows:
        print("no rows with stored rounds in those files", file=sys.stderr)
        return 1
    print("Alarms: `regression` at a slowdown; any verdict but pass/inconclusive at 0 % "
          "(A/A).\n")
    print(table(rows))
    if ns.json:
        ns.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
