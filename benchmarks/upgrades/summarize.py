"""Summarize the upgrade sessions' JSON reports (benchmarks/upgrades/*.sh) into one compact
results file: per session, the stack line, the verdict counts per check, and every
regression and improvement with its detail.

    python benchmarks/upgrades/summarize.py OUT.json NAME=REPORT.json [NAME=REPORT.json ...]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def summary(report: dict[str, Any]) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    changes: list[dict[str, str]] = []
    stacks: set[str] = set()
    for case in report["cases"]:
        for check in case["checks"]:
            counts[f"{check['metric']} {check['verdict']}"] += 1
            stack = check.get("data", {}).get("stack")
            if isinstance(stack, list):
                stacks.add(", ".join(stack))
            if check["verdict"] in ("regression", "improvement"):
                changes.append({"case": case["nodeid"], "metric": check["metric"],
                                "verdict": check["verdict"], "detail": check["detail"]})
    return {"cases": len(report["cases"]), "stack": sorted(stacks),
            "counts": dict(sorted(counts.items())), "changes": changes}


def main(argv: list[str]) -> None:
    out, pairs = Path(argv[0]), [a.split("=", 1) for a in argv[1:]]
    data = {name: summary(json.loads(Path(path).read_text())) for name, path in pairs}
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
