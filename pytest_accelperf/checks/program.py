"""The program check: what the step's compiled program does, against the baseline's.

No timing is involved: FLOPs, bytes accessed, collectives (count and bytes per step),
host callbacks, custom calls, torch.compile's graphs, graph breaks and recompiles, and an
eager torch step's host syncs and matrix-product dtypes are read from the program
(:mod:`pytest_accelperf.records.program` describes the record), so the verdict is the same on a
quiet machine and on a loaded one. The rule:

* the same program (counts equal, amounts within ``program_tolerance``): ``pass``;
* anything more (another all-gather, more FLOPs, a host callback, a graph break, a
  ``.item()``, matrix products in float32 instead of bfloat16):
  ``regression``, naming each change (``all-gather: 2 → 6 per step (+48.00 MiB);
  FLOPs +0.0%``) and the largest changes of the op histogram, the likely cause;
* only less: ``improvement``.

The numbers are only compared where the baseline was recorded in the same environment
(framework versions: XLA's cost model moves between releases; ``incomparable``
otherwise, as throughput) and by the same kind of program (``source``). What it cannot
see: a kernel that got slower doing the same work; the timing checks (A/B mode above
all) cover that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import CheckInput, one
from pytest_accelperf.records.program import (
    AMOUNTS,
    COUNTS,
    TORCH_OPS,
    ProgramRecord,
    changes,
    comparable_flops,
    describe_changes,
    matmul_dtypes,
    ops_deltas,
)
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import (
    CheckData,
    CheckResult,
    CountChange,
    Tolerances,
    Verdict,
)
from pytest_accelperf.stats.units import fmt_tolerance
from pytest_accelperf.store.block import Block, BlockLike, json_of, read_block

METRIC = "program"
#: The op-histogram moves a program check keeps for the reports (``data["op_changes"]``).
OP_CHANGES = 8
UNIT = "flop"
_REMEDY = "if the change is intended, re-record with --accelperf-update"


def _flops(program: Mapping[str, object] | None) -> float | None:
    value = (program or {}).get("flops")
    return float(value) if isinstance(value, int | float) else None


def summary(program: Mapping[str, Any]) -> str:
    """``"xla program: 3 collectives, 0 host callbacks"``: what a passing check saw."""
    parts: list[str] = []
    coll = program.get("collectives")
    if isinstance(coll, dict):
        n = sum(int(c.get("count", 0)) for c in coll.values())
        kinds = ", ".join(f"{k} x{int(c.get('count', 0))}" for k, c in sorted(coll.items()))
        parts.append(f"{n} collective(s)" + (f" ({kinds})" if kinds else ""))
    for key, label in (("host_callbacks", "host callback(s)"), ("host_syncs", "host sync(s)"),
                       ("graphs", "graph(s)"), ("graph_breaks", "graph break(s)"),
                       ("recompiles", "recompile(s)")):
        if isinstance(program.get(key), int):
            parts.append(f"{program[key]} {label}")
    if program.get("source") in TORCH_OPS and isinstance(program.get("ops"), dict):
        ops = program["ops"]
        mm = ", ".join(f"{t} x{n}" for t, n in sorted(matmul_dtypes(ops).items()))
        parts.append(f"{sum(int(n) for n in ops.values())} ops dispatched"
                     + (f" (matmuls {mm})" if mm else ""))
    return f"{program.get('source', '?')} program" + (f": {', '.join(parts)}" if parts else "")


def not_in_baseline(base: Mapping[str, object], now: Mapping[str, object]) -> list[str]:
    """What this run's record gates that the baseline's does not have (``host syncs``,
    ``op histogram``): a baseline recorded before the backend read them. Those compare
    as nothing, not as a change."""
    labels = {**{k: label for k, (label, _) in AMOUNTS.items()}, **COUNTS,
              "collectives": "collectives", "ops": "op histogram"}
    return [label for key, label in labels.items() if key in now and key not in base]


def _record(block: Block) -> Mapping[str, Any] | None:
    """``block``'s program record as the JSON that :mod:`pytest_accelperf.records.program` reads
    (the history's change points read it too); None where it has none."""
    return json_of(block.program) or None


def check_program(block: BlockLike, baseline: BlockLike | None, tol: Tolerances, *,
                  comparable: bool) -> CheckResult | None:
    """``block``'s program against ``baseline``'s; None when this run recorded none."""
    block, baseline = read_block(block), read_block(baseline)
    now = _record(block)
    if not now:
        return None
    # The block's program section is the JSON of a run's ProgramRecord.
    data: CheckData = {"source": now.get("source", ""), "program": cast(ProgramRecord, now)}
    if baseline is None:
        return new_result(METRIC, now=_flops(now), unit=UNIT, data=data)
    base = _record(baseline)
    if not base:
        return missing_in_baseline(METRIC, "program record", baseline, now=_flops(now),
                                   unit=UNIT)
    tolerance = tol.program_tolerance
    base_flops, now_flops = _flops(base), _flops(now)
    change = now_flops / base_flops - 1 if base_flops and now_flops is not None else None
    data = {**data, "tolerance": tolerance}
    result = CheckResult(METRIC, Verdict.PASS, "", baseline=base_flops, now=now_flops,
                         unit=UNIT, change=change, data=data)
    if not comparable:
        return replace(result, verdict=Verdict.INCOMPARABLE, detail=(
            "baseline recorded in another environment (framework versions move "
            "the compiler's counts); program not compared"))
    if base.get("source") != now.get("source"):
        return replace(result, verdict=Verdict.INCOMPARABLE, detail=(
            f"this program was read by {now.get('source')}, the baseline's by "
            f"{base.get('source')}; re-record with --accelperf-update"))
    compared, unlike = comparable_flops(base, now)
    if unlike:
        result = replace(result, baseline=None, change=None)
        data["not_compared"] = unlike
    found = changes(compared, now, tolerance)
    lines = describe_changes(compared, now, tolerance) + ([unlike] if unlike else [])
    data["changes"] = [CountChange(name=c.name, baseline=c.baseline, now=c.now) for c in found]
    # The op histogram's largest moves, for the reports' program-diff table.
    data["op_changes"] = [CountChange(name=op, baseline=b, now=n)
                          for op, b, n in ops_deltas(compared, now)[:OP_CHANGES]]
    unrecorded = not_in_baseline(base, now)
    if unrecorded:
        data["not_in_baseline"] = unrecorded
    if not found:
        detail = (f"same program as the baseline ({summary(now)}; amounts within "
                  f"{fmt_tolerance(tolerance)})")
        if lines:  # only the op histogram moved
            detail += f"; {'; '.join(lines)}"
        if unrecorded:
            detail += (f"; the baseline has no {', '.join(unrecorded)} (recorded "
                       f"before they were read): not compared; re-record with "
                       f"--accelperf-update to gate them")
        return replace(result, detail=detail, data=data)
    if any(c.more for c in found):
        return replace(result, verdict=Verdict.REGRESSION, data=data,
                       detail=f"{'; '.join(lines)} ({_REMEDY})")
    return replace(result, verdict=Verdict.IMPROVEMENT, data=data, detail=(
        f"{'; '.join(lines)}: less work than the baseline; run with "
        f"--accelperf-update to record it"))


class ProgramCheck(BaseCheck):
    """The ``program`` row: the compiled program, compared where another host CPU would
    run the same program (``program_comparable``)."""

    metric = METRIC
    tolerances = ("program_tolerance",)
    sections = ("program",)

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        if not given.ok:
            return ()
        return one(check_program(given.block, given.baseline, given.tol,
                                 comparable=given.program_comparable))

    def record(self, run: Run) -> Mapping[str, object]:
        """``program``, the record of what the step's compiled program does."""
        return {"program": run.program} if run.outcome == "ok" and run.program is not None \
            else {}


CHECK = ProgramCheck()
