"""The program record: what the compiled (or traced) program of one training step does,
read from the program itself, not timed; the same on every run of unchanged code.

A backend fills ``Run.program`` with :func:`program_record`; the ``program`` check
(:mod:`pytest_accelperf.checks.program`) compares it with the baseline's and A/B mode
prints the difference of the two arms' (:func:`describe_changes`). The record is plain
JSON, every field optional (a backend says what it can see):

``source``
    who read it: ``"xla"`` (a JAX program's HLO and cost analysis), ``"torch"`` (eager
    torch, FLOPs only), ``"torch.compile"`` (plus dynamo's graphs), ``"deepspeed"`` or
    ``"ddp"`` (plus the bytes each rank communicates).
``flops``
    the model's FLOPs per step (the unpartitioned program; replicated work counted once).
``global_flops``
    ``true`` where ``flops`` were counted on a second lowering of the step, on one device
    over the global batch (a JAX ``bind_axes`` step, whose unpartitioned program under
    ``shard_map`` is one shard's). A baseline without it counted one shard: its FLOPs are
    not compared with these (:func:`comparable_flops`).
``hardware_flops``
    what all the devices execute per step (replicated work counted on every replica).
``bytes_accessed``
    bytes the devices read and write per step (the compiler's cost analysis, all devices).
``collectives``
    ``{kind: {"count": n, "bytes": b}}`` per step: kind is ``all-reduce``, ``all-gather``,
    ``reduce-scatter``, ``all-to-all``, ``collective-permute`` (XLA) or the
    ``torch.distributed`` name (``all_reduce``, ``all_gather``, ``reduce_scatter``,
    ``broadcast``); ``bytes`` is the payload of one device (one rank).
``host_callbacks``
    host round-trips per step (``jax.debug.callback``, ``jax.pure_callback``, ...).
``custom_calls``
    other custom calls per step (library kernels the compiler does not see into).
``graphs``, ``graph_breaks``, ``recompiles``
    torch.compile: graphs made and graph breaks while compiling (step 0), and
    recompilations after it (the later warm-up steps and the measured ones);
    ``break_reasons`` lists the breaks' reasons, ``recompile_causes`` the input that
    changed at each step that compiled again (a batch leaf's shape before → after), both
    not compared, shown.
``ops``
    ``{op: count}``: a histogram of the program's operations (``dot``, ``fusion``,
    ``convolution``; a dot's precision is part of its name, ``dot[highest]``). Not gated
    on its own, except the dots and convolutions of a non-default precision (a precision
    change costs time with the same FLOPs); a change in it is shown beside the change it
    explains.

Every quantity but ``ops``, ``break_reasons`` and ``recompile_causes`` is gated: more is a
regression, less an improvement. Counts (collectives, callbacks, graphs, breaks,
recompiles) are compared exactly; amounts (FLOPs, bytes) within the ``program_tolerance``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_accelperf.units import fmt_bytes, fmt_signed_percent

#: Program sources (``Run.program["source"]``).
SOURCES = ("xla", "torch", "torch.compile", "deepspeed", "ddp")

#: Amounts: compared within a relative tolerance. Name -> (label, unit).
AMOUNTS: dict[str, tuple[str, str]] = {
    "flops": ("FLOPs", "flop"),
    "hardware_flops": ("hardware FLOPs", "flop"),
    "bytes_accessed": ("bytes accessed", "bytes"),
}
#: Counts: compared exactly. Name -> label.
COUNTS: dict[str, str] = {
    "host_callbacks": "host callbacks",
    "custom_calls": "custom calls",
    "graphs": "graphs",
    "graph_breaks": "graph breaks",
    "recompiles": "recompiles",
}


def program_record(source: str, *, flops: float | None = None,
                   hardware_flops: float | None = None, bytes_accessed: float | None = None,
                   collectives: Mapping[str, Mapping[str, int]] | None = None,
                   host_callbacks: int | None = None, custom_calls: int | None = None,
                   graphs: int | None = None, graph_breaks: int | None = None,
                   recompiles: int | None = None, break_reasons: list[str] | None = None,
                   recompile_causes: list[str] | None = None,
                   ops: Mapping[str, int] | None = None,
                   global_flops: bool = False) -> dict[str, Any]:
    """A ``Run.program`` record (see the module docstring); None fields are left out."""
    if source not in SOURCES:
        raise ValueError(f"program source {source!r} is not one of {', '.join(SOURCES)}")
    record: dict[str, Any] = {"source": source}
    for name, value in (("flops", flops), ("hardware_flops", hardware_flops),
                        ("bytes_accessed", bytes_accessed)):
        if value is not None:
            record[name] = float(value)
    if global_flops and flops is not None:
        record["global_flops"] = True
    if collectives is not None:
        record["collectives"] = {
            kind: {"count": int(c.get("count", 0)), "bytes": int(c.get("bytes", 0))}
            for kind, c in sorted(collectives.items())}
    for name, count in (("host_callbacks", host_callbacks), ("custom_calls", custom_calls),
                        ("graphs", graphs), ("graph_breaks", graph_breaks),
                        ("recompiles", recompiles)):
        if count is not None:
            record[name] = int(count)
    if break_reasons is not None:
        record["break_reasons"] = [str(r) for r in break_reasons]
    if recompile_causes is not None:
        record["recompile_causes"] = [str(r) for r in recompile_causes]
    if ops is not None:
        record["ops"] = {str(k): int(v) for k, v in sorted(ops.items()) if int(v)}
    return record


def comparable_flops(baseline: Mapping[str, Any],
                     now: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """``baseline`` as it is compared with ``now``, and why it lost a field (else ``""``):
    without its ``flops`` when ``now``'s were counted over the global batch
    (``global_flops``) and the baseline's were not, one shard's (a ``bind_axes`` step
    recorded before: 21.5 MFLOP stored for ``test_pmap_style``'s 4x2 case, a quarter of
    its step)."""
    if now.get("global_flops") and not baseline.get("global_flops") and "flops" in baseline:
        kept = {k: v for k, v in baseline.items() if k != "flops"}
        return kept, ("FLOPs not compared: the baseline's count is one shard's, recorded "
                      "before a bind_axes step was counted over the global batch "
                      "(--accelperf-update records it)")
    return baseline, ""


@dataclass(frozen=True)
class Change:
    """One gated quantity that differs between two programs."""

    name: str  #: ``flops``, ``collectives.all-gather.count``, ...
    label: str  #: what a reader calls it: ``FLOPs``, ``all-gather``
    baseline: float
    now: float
    exact: bool  #: a count (compared exactly), else an amount (within the tolerance)

    @property
    def more(self) -> bool:
        return self.now > self.baseline

    @property
    def ratio(self) -> float:
        if self.baseline:
            return self.now / self.baseline
        return 1.0 if self.now == self.baseline else float("inf")


def _collectives(program: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    raw = program.get("collectives")
    return {str(k): {"count": int(v.get("count", 0)), "bytes": int(v.get("bytes", 0))}
            for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def changes(baseline: Mapping[str, Any], now: Mapping[str, Any],
            tolerance: float) -> list[Change]:
    """The gated quantities that differ: counts that are not equal, amounts whose ratio is
    beyond ``1 ± tolerance``. A quantity only one side has is not compared, except
    collectives: when both sides report collectives, a kind only one has counts as 0 on
    the other (a sharding change that adds an all-gather)."""
    out: list[Change] = []
    for name, (label, _unit) in AMOUNTS.items():
        b, n = baseline.get(name), now.get(name)
        if isinstance(b, int | float) and isinstance(n, int | float):
            change = Change(name, label, float(b), float(n), exact=False)
            if abs(change.ratio - 1) > tolerance:
                out.append(change)
    if "collectives" in baseline and "collectives" in now:
        base_c, now_c = _collectives(baseline), _collectives(now)
        for kind in sorted(set(base_c) | set(now_c)):
            b_k = base_c.get(kind, {"count": 0, "bytes": 0})
            n_k = now_c.get(kind, {"count": 0, "bytes": 0})
            if b_k["count"] != n_k["count"]:
                out.append(Change(f"collectives.{kind}.count", kind, b_k["count"],
                                  n_k["count"], exact=True))
            else:
                bytes_change = Change(f"collectives.{kind}.bytes", f"{kind} bytes",
                                      b_k["bytes"], n_k["bytes"], exact=False)
                if abs(bytes_change.ratio - 1) > tolerance:
                    out.append(bytes_change)
    for name, label in COUNTS.items():
        b, n = baseline.get(name), now.get(name)
        if isinstance(b, int) and isinstance(n, int) and b != n:
            out.append(Change(name, label, b, n, exact=True))
    b_ops, n_ops = baseline.get("ops"), now.get("ops")
    if isinstance(b_ops, Mapping) and isinstance(n_ops, Mapping):
        for op in sorted(k for k in set(b_ops) | set(n_ops) if _precise(k)):
            b_count, n_count = int(b_ops.get(op, 0)), int(n_ops.get(op, 0))
            if b_count != n_count:
                out.append(Change(f"ops.{op}", f"{op} (matmul precision)", b_count, n_count,
                                  exact=True))
    return out


def _precise(op: str) -> bool:
    """An op whose name carries a non-default precision (``dot[highest]``): gated, since a
    precision change costs time without changing the FLOPs."""
    return "[" in op and op.split("[", 1)[0] in ("dot", "convolution")


def _ops_delta(baseline: Mapping[str, Any], now: Mapping[str, Any], limit: int = 4) -> str:
    """``"ops: dot 12 → 14, fusion 30 → 31"``: the largest changes of the op histogram."""
    b_ops = baseline.get("ops") if isinstance(baseline.get("ops"), Mapping) else None
    n_ops = now.get("ops") if isinstance(now.get("ops"), Mapping) else None
    if b_ops is None or n_ops is None:
        return ""
    deltas = [(op, int(b_ops.get(op, 0)), int(n_ops.get(op, 0)))
              for op in set(b_ops) | set(n_ops) if b_ops.get(op, 0) != n_ops.get(op, 0)]
    if not deltas:
        return ""
    deltas.sort(key=lambda d: (-abs(d[2] - d[1]), d[0]))
    shown = ", ".join(f"{op} {b} → {n}" for op, b, n in deltas[:limit])
    more = f" (+{len(deltas) - limit} more)" if len(deltas) > limit else ""
    return f"ops: {shown}{more}"


def _describe(change: Change, baseline: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    if change.name.startswith("collectives.") and change.name.endswith(".count"):
        kind = change.label
        b_bytes = _collectives(baseline).get(kind, {}).get("bytes", 0)
        n_bytes = _collectives(now).get(kind, {}).get("bytes", 0)
        delta = n_bytes - b_bytes
        sign = "+" if delta >= 0 else "-"
        return (f"{kind}: {change.baseline:g} → {change.now:g} per step "
                f"({sign}{fmt_bytes(abs(delta))})")
    if change.name == "graph_breaks" and change.more:
        reasons = [str(r) for r in now.get("break_reasons") or []
                   if r not in (baseline.get("break_reasons") or [])]
        where = f" ({'; '.join(reasons[:2])})" if reasons else ""
        return f"{change.label}: {change.baseline:g} → {change.now:g} per step{where}"
    if change.name == "recompiles" and change.more:
        causes = [str(r) for r in now.get("recompile_causes") or []]
        if causes:
            fix = ("; one compiled graph serves batches of one shape: a fixed batch size "
                   "(drop_last=True for a loader), or mark the dimension dynamic "
                   "(torch._dynamo.mark_dynamic)" if any("changed batch leaf" in c
                                                         for c in causes) else "")
            more = f"; +{len(causes) - 2} more" if len(causes) > 2 else ""
            return (f"{change.label}: {change.baseline:g} → {change.now:g} per step "
                    f"({'; '.join(causes[:2])}{more}{fix})")
    if change.exact:
        return f"{change.label}: {change.baseline:g} → {change.now:g} per step"
    unit = AMOUNTS.get(change.name, ("", "bytes"))[1]
    if unit == "bytes":
        return (f"{change.label}: {fmt_bytes(change.baseline)} → {fmt_bytes(change.now)} "
                f"({fmt_signed_percent(change.ratio - 1)})")
    return f"{change.label} {fmt_signed_percent(change.ratio - 1)}"


def describe_changes(baseline: Mapping[str, Any], now: Mapping[str, Any],
                     tolerance: float) -> list[str]:
    """Each change in words, the gated ones first (``all-gather: 2 → 6 per step
    (+48.0 MiB)``), then ``FLOPs +0.0 %`` when the FLOPs did not change, and the op
    histogram's largest changes; empty when the programs agree, ops included."""
    found = changes(baseline, now, tolerance)
    lines = [_describe(c, baseline, now) for c in found]
    if found and not any(c.name == "flops" for c in found):
        b, n = baseline.get("flops"), now.get("flops")
        if isinstance(b, int | float) and isinstance(n, int | float) and b:
            lines.append(f"FLOPs {fmt_signed_percent(n / b - 1)}")
    ops = _ops_delta(baseline, now)
    if ops:
        lines.append(ops)
    return lines
