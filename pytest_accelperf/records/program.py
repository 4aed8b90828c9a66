"""The program record: what the compiled (or traced) program of one training step does,
read from the program itself, not timed; the same on every run of unchanged code.

A backend fills ``Run.program`` with :func:`program_record`; the ``program`` check
(:mod:`pytest_accelperf.checks.program`) compares it with the baseline's and A/B mode
prints the difference of the two arms' (:func:`describe_changes`). The record is plain
JSON, every field optional (a backend says what it can see):

``source``
    who read it: ``"xla"`` (a JAX program's HLO and cost analysis), ``"torch"`` (an eager
    torch step's dispatched ops, :mod:`pytest_accelperf.backends.torch.ops`),
    ``"torch.compile"`` (FLOPs and dynamo's graphs), ``"deepspeed"`` or ``"ddp"`` (rank
    0's dispatched ops, and the bytes each rank communicates).
``flops``
    the model's FLOPs per step (the unpartitioned program; replicated work counted once).
``global_flops``
    ``true`` where ``flops`` were counted on a second lowering of the step, on one device
    over the global batch (a JAX ``bind_axes`` step, whose unpartitioned program under
    ``shard_map`` is one shard's). A baseline without it counted one shard: its FLOPs are
    not compared with these (:func:`comparable_flops`).
``hardware_flops``
    what all the devices execute per step (replicated work counted on every replica).
``loops``
    XLA: the ``while`` loops (a ``lax.scan``, a static ``fori_loop``) whose bodies the
    amounts count once per iteration, where XLA's own cost analysis counts a body once
    (:func:`pytest_accelperf.backends.jax.hlo.loop_corrected`). A baseline without it
    where a record has it counted each body once: its amounts are not compared with
    these (:func:`comparable_flops`). Not gated itself.
``bytes_accessed``
    bytes the devices read and write per step: XLA, the compiler's cost analysis (all
    devices); torch, the tensor inputs and outputs of the ops an eager step dispatches
    (one rank's, for ranks).
``collectives``
    ``{kind: {"count": n, "bytes": b}}`` per step: kind is ``all-reduce``, ``all-gather``,
    ``reduce-scatter``, ``all-to-all``, ``collective-permute`` (XLA) or the
    ``torch.distributed`` name (``all_reduce``, ``all_gather``, ``reduce_scatter``,
    ``broadcast``); ``bytes`` is the payload of one device (one rank).
``host_callbacks``
    host round-trips per step (``jax.debug.callback``, ``jax.pure_callback``, ...): the
    device calls Python and waits for it.
``host_syncs`` and ``host_sync_sites``
    torch: the host waits for the device, per step (``.item()``, a data-dependent shape
    such as ``nonzero``, a blocking copy to the CPU); the sites (``{"_local_scalar_dense
    at suites/x.py in step: logged = loss.item()": 1}``: the op, and the file, function
    and source text of the line, not its number: :mod:`pytest_accelperf.records.sites`) are
    shown beside a change, not gated; a line that only moved is the same site. Apart
    from ``host_callbacks``: the other way round (Python waits for the device), and a
    record of either kind has only one of them.
``custom_calls``
    other custom calls per step (library kernels the compiler does not see into).
``dispatches``
    programs the host launches per step: 1 for a step compiled whole, one per operation
    for a JAX step run op by op (Keras's ``jit_compile=False``; :mod:`.backends.keras`).
``graphs``, ``graph_breaks``, ``recompiles``
    torch.compile: graphs made and graph breaks while compiling (step 0), and
    recompilations after it (the later warm-up steps and the measured ones);
    ``break_reasons`` lists the breaks' reasons (each with its site, by function and
    source text, as a host sync's), ``recompile_causes`` the input that
    changed at each step that compiled again (a batch leaf's shape before → after), both
    not compared, shown.
``ops``
    ``{op: count}``: a histogram of the program's operations. XLA: ``dot``, ``fusion``,
    ``convolution``; a dot's precision is part of its name, ``dot[highest]``. Torch: the
    aten ops with their inputs' dtypes, ``mm[bf16]``, ``_softmax[f32]``. Not gated on its
    own, except the dots and convolutions of a non-default precision (XLA) and the
    dtypes of the matrix products (torch, :data:`MATMULS`): a precision change costs
    time with the same FLOPs. A change in it is shown beside the change it explains.

Every quantity but ``ops``, ``break_reasons``, ``recompile_causes`` and
``host_sync_sites`` is gated: more is a regression, less an improvement. Counts
(collectives, callbacks, host syncs, graphs, breaks, recompiles) are compared exactly;
amounts (FLOPs, bytes) within the ``program_tolerance``. Matrix products in wider dtypes
(``matmul dtypes: bf16 24 → 0, f32 0 → 24``) are more; a mix of the same widths
(``bf16`` for ``f16``) is shown, not gated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast, get_args

from pydantic import ConfigDict, Field, with_config
from typing_extensions import Required, TypedDict  # pydantic reads TypedDict of these

from pytest_accelperf.records.sites import compare_counts, new_reasons
from pytest_accelperf.stats.units import fmt_bytes, fmt_signed_percent

#: Program sources (``Run.program["source"]``).
Source = Literal["xla", "torch", "torch.compile", "deepspeed", "ddp"]
SOURCES: tuple[str, ...] = get_args(Source)
#: Sources whose ``ops`` are torch's dispatched aten ops, named with their inputs' dtypes.
TORCH_OPS = ("torch", "deepspeed", "ddp")
#: Torch's matrix products: ``matmul dtypes`` counts them by their inputs' dtypes
#: (``matmul`` and ``linear`` decompose into the others before they are dispatched; they
#: are here for a tensor subclass that dispatches them whole).
MATMULS = frozenset({"mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "mv",
                     "addmv", "dot", "_scaled_mm"})
#: Bytes of an element, by the dtype names of torch's op keys
#: (:data:`pytest_accelperf.backends.torch.ops.DTYPE_TAGS`).
DTYPE_BYTES: dict[str, int] = {
    "f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1,
    "b8": 1, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}

#: A count of the record (non-negative); an amount (non-negative, finite). The constraints
#: are pydantic's: the store validates a block's ``program`` with them
#: (:class:`pytest_accelperf.store.block.Program`), the history reader a line's
#: (:class:`pytest_accelperf.store.schema.HistoryNumbers`).
_Count = Annotated[int, Field(ge=0)]
_Amount = Annotated[float, Field(ge=0)]
#: As a dict, the record is read strict and finite; unknown keys are skipped unread.
_AS_DICT = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


@with_config(_AS_DICT)
class CollectiveRecord(TypedDict):
    """One kind of collective in one step: how many, and one device's bytes."""

    count: _Count
    bytes: _Count


@with_config(_AS_DICT)
class ProgramRecord(TypedDict, total=False):
    """The program record (the module docstring), declared once: the form of
    ``Run.program``, of a baseline block's ``program``
    (:class:`pytest_accelperf.store.block.Program` is made of these fields, a model that
    keeps unknown keys) and of a history line's, read as this dict by
    :class:`pytest_accelperf.store.schema.HistoryNumbers`, validated as ``Program``
    validates, its unknown keys skipped instead of kept. Change-point analysis reads a
    program record of every history line, and compares each with the next: a dict is
    built and compared in C, a model in Python (a third of the time of ``accelperf
    history changes`` over 100,000 lines was the models'). Every field but ``source`` is
    optional."""

    source: Required[Source]
    flops: _Amount | None
    #: ``flops`` counted over the global batch on a second lowering (a bind_axes step).
    global_flops: bool | None
    hardware_flops: _Amount | None
    bytes_accessed: _Amount | None
    loops: _Count | None
    collectives: dict[str, CollectiveRecord] | None
    host_callbacks: _Count | None
    host_syncs: _Count | None
    host_sync_sites: dict[str, _Count] | None
    custom_calls: _Count | None
    dispatches: _Count | None
    graphs: _Count | None
    graph_breaks: _Count | None
    recompiles: _Count | None
    break_reasons: list[str] | None
    recompile_causes: list[str] | None
    ops: dict[str, _Count] | None


#: Amounts: compared within a relative tolerance. Name -> (label, unit).
AMOUNTS: dict[str, tuple[str, str]] = {
    "flops": ("FLOPs", "flop"),
    "hardware_flops": ("hardware FLOPs", "flop"),
    "bytes_accessed": ("bytes accessed", "bytes"),
}
#: Counts: compared exactly. Name -> label.
COUNTS: dict[str, str] = {
    "host_callbacks": "host callbacks",
    "host_syncs": "host syncs",
    "custom_calls": "custom calls",
    "dispatches": "dispatches",
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
                   ops: Mapping[str, int] | None = None, host_syncs: int | None = None,
                   host_sync_sites: Mapping[str, int] | None = None,
                   global_flops: bool = False, loops: int | None = None) -> ProgramRecord:
    """A ``Run.program`` record (see the module docstring), in the form of
    :class:`ProgramRecord`; None fields are left out (the keys in this order, as the JSON
    written has them)."""
    if source not in SOURCES:
        raise ValueError(f"program source {source!r} is not one of {', '.join(SOURCES)}")
    record: ProgramRecord = {"source": cast(Source, source)}
    if flops is not None:
        record["flops"] = float(flops)
    if hardware_flops is not None:
        record["hardware_flops"] = float(hardware_flops)
    if bytes_accessed is not None:
        record["bytes_accessed"] = float(bytes_accessed)
    if global_flops and flops is not None:
        record["global_flops"] = True
    if loops:
        record["loops"] = int(loops)
    if collectives is not None:
        record["collectives"] = {
            kind: {"count": int(c.get("count", 0)), "bytes": int(c.get("bytes", 0))}
            for kind, c in sorted(collectives.items())}
    counts = {"host_callbacks": host_callbacks, "host_syncs": host_syncs,
              "custom_calls": custom_calls, "graphs": graphs, "graph_breaks": graph_breaks,
              "recompiles": recompiles}  # the exact counts, each where it was counted
    record.update(cast(ProgramRecord, {k: int(v) for k, v in counts.items() if v is not None}))
    if break_reasons is not None:
        record["break_reasons"] = [str(r) for r in break_reasons]
    if recompile_causes is not None:
        record["recompile_causes"] = [str(r) for r in recompile_causes]
    if ops is not None:
        record["ops"] = {str(k): int(v) for k, v in sorted(ops.items()) if int(v)}
    if host_sync_sites is not None:
        record["host_sync_sites"] = {str(k): int(v) for k, v in sorted(host_sync_sites.items())
                                     if int(v)}
    return record


def comparable_flops(baseline: Mapping[str, Any],
                     now: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """``baseline`` as it is compared with ``now``, and why it lost a field (else ``""``):
    without its ``flops`` when ``now``'s were counted over the global batch
    (``global_flops``) and the baseline's were not, one shard's (a ``bind_axes`` step
    recorded before: 21.5 MFLOP stored for ``test_pmap_style``'s 4x2 case, a quarter of
    its step); without its amounts when ``now`` counted loop bodies per iteration
    (``loops``) and the baseline did not (recorded before, or by a jaxlib that cannot
    cost a body alone: a pipeline's 7 ticks stored as one)."""
    if now.get("loops") and not baseline.get("loops") and any(k in baseline for k in AMOUNTS):
        kept = {k: v for k, v in baseline.items() if k not in AMOUNTS}
        return kept, ("FLOPs and bytes not compared: the baseline counted each loop's body "
                      "once, where these count it once per iteration (recorded before the "
                      "plugin counted loops, or by a jaxlib that cannot cost a loop's body; "
                      "--accelperf-update records it)")
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
    the other (a sharding change that adds an all-gather). From the op histograms: XLA's
    dots of a non-default precision, one change each; torch's matrix products by dtype,
    one change (``matmul_dtypes``, whose numbers are :func:`_width`'s) when they got wider
    or narrower."""
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
    if not isinstance(b_ops, Mapping) or not isinstance(n_ops, Mapping):
        return out
    if now.get("source") in TORCH_OPS:
        b_mm, n_mm = matmul_dtypes(b_ops), matmul_dtypes(n_ops)
        b_width, n_width = _width(b_mm), _width(n_mm)
        if b_mm != n_mm and b_width != n_width:
            out.append(Change("matmul_dtypes", "matmul dtypes", b_width, n_width, exact=True))
    else:
        for op in sorted(k for k in set(b_ops) | set(n_ops) if _precise(k)):
            b_count, n_count = int(b_ops.get(op, 0)), int(n_ops.get(op, 0))
            if b_count != n_count:
                out.append(Change(f"ops.{op}", f"{op} (matmul precision)", b_count, n_count,
                                  exact=True))
    return out


def matmul_dtypes(ops: Mapping[str, Any]) -> dict[str, int]:
    """``{"bf16": 24}``: torch's matrix products (:data:`MATMULS`) in an op histogram, by
    their inputs' dtypes (``"bf16,f32"`` for mixed inputs)."""
    out: dict[str, int] = {}
    for key, count in ops.items():
        name, _, dtypes = str(key).partition("[")
        if name in MATMULS and dtypes:
            tag = dtypes.rstrip("]")
            out[tag] = out.get(tag, 0) + int(count)
    return out


def _width(by_dtype: Mapping[str, int]) -> float:
    """How wide a step's matrix products are: the sum over them of their widest input's
    bytes per element (``matmul_dtypes``'s ``Change`` compares these: more is wider).
    A dtype :data:`DTYPE_BYTES` does not know counts 0 (a change to it is only shown)."""
    return float(sum(count * max(DTYPE_BYTES.get(t, 0) for t in tag.split(","))
                     for tag, count in by_dtype.items()))


def _matmul_line(baseline: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """``"matmul dtypes: bf16 24 → 0, f32 0 → 24"``; empty when they agree or either side
    has no torch op histogram."""
    b_ops, n_ops = baseline.get("ops"), now.get("ops")
    if (now.get("source") not in TORCH_OPS or not isinstance(b_ops, Mapping)
            or not isinstance(n_ops, Mapping)):
        return ""
    b_mm, n_mm = matmul_dtypes(b_ops), matmul_dtypes(n_ops)
    if b_mm == n_mm:
        return ""
    parts = [f"{tag} {b_mm.get(tag, 0)} → {n_mm.get(tag, 0)}"
             for tag in sorted(set(b_mm) | set(n_mm)) if b_mm.get(tag, 0) != n_mm.get(tag, 0)]
    return f"matmul dtypes: {', '.join(parts)}"


def _precise(op: str) -> bool:
    """An op whose name carries a non-default precision (``dot[highest]``): gated, since a
    precision change costs time without changing the FLOPs."""
    return "[" in op and op.split("[", 1)[0] in ("dot", "convolution")


def ops_deltas(baseline: Mapping[str, Any],
               now: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """Every op whose count differs, as ``(op, baseline, now)``, largest change first;
    torch's ops that appeared or went come first (see :func:`_ops_delta`)."""
    b_ops = baseline.get("ops") if isinstance(baseline.get("ops"), Mapping) else None
    n_ops = now.get("ops") if isinstance(now.get("ops"), Mapping) else None
    if b_ops is None or n_ops is None:
        return []
    deltas = [(op, int(b_ops.get(op, 0)), int(n_ops.get(op, 0)))
              for op in set(b_ops) | set(n_ops) if b_ops.get(op, 0) != n_ops.get(op, 0)]
    swapped_first = now.get("source") in TORCH_OPS
    deltas.sort(key=lambda d: (swapped_first and bool(d[1] and d[2]), -abs(d[2] - d[1]), d[0]))
    return deltas


def _ops_delta(baseline: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """``"ops: dot 12 → 14, fusion 30 → 31"``: the largest changes of the op histogram.
    Torch's ops that appeared or went come first (a kernel swapped for several, attention
    falling back to matmuls and a softmax: the likely cause, where the larger counts are
    the kernels replacing it; six are shown, as one swap changes several)."""
    deltas = ops_deltas(baseline, now)
    if not deltas:
        return ""
    limit = 6 if now.get("source") in TORCH_OPS else 4
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
        reasons = new_reasons(baseline.get("break_reasons") or [],
                              now.get("break_reasons") or [])
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
    if change.name == "host_syncs":
        grown = [f"{site}: {b} → {n}" for site, b, n in compare_counts(
            baseline.get("host_sync_sites") or {}, now.get("host_sync_sites") or {})]
        more = f"; +{len(grown) - 2} more" if len(grown) > 2 else ""
        where = f" ({'; '.join(grown[:2])}{more})" if grown else ""
        return f"{change.label}: {change.baseline:g} → {change.now:g} per step{where}"
    if change.name == "matmul_dtypes":
        return _matmul_line(baseline, now)
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
    mix = _matmul_line(baseline, now)
    if mix and not any(c.name == "matmul_dtypes" for c in found):
        lines.append(mix)  # the same widths in another mix: shown, not gated
    ops = _ops_delta(baseline, now)
    if ops:
        lines.append(ops)
    return lines
