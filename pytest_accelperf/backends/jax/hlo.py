"""Read a compiled XLA program into a program record (:mod:`pytest_accelperf.records.program`).

:func:`program_of` takes a jitted step's ``Lowered`` and ``Compiled`` and returns
``program_record("xla", ...)``:

``flops``
    the unpartitioned program's cost analysis (:func:`model_flops`): the model's FLOPs,
    compute the mesh replicates counted once.
``hardware_flops``, ``bytes_accessed``
    one device's compiled cost analysis (``flops``, ``bytes accessed``) times the device
    count: what all devices execute and move, replicated work on every replica.
``collectives``, ``host_callbacks``, ``custom_calls``, ``ops``
    read from the optimized, partitioned HLO text (``compiled.as_text()``) by
    :func:`read_hlo`, the one place that parses it.

How the HLO is counted (checked on XLA:CPU's text in jax 0.10.2):

* Collectives (``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``,
  ``collective-permute``, ``collective-broadcast``; ``ragged-all-to-all`` counts as
  ``all-to-all``) are counted per step, with ``bytes`` the size of the instruction's
  result on one device, a tuple's elements summed (a combined all-reduce of three arrays
  is one all-reduce of their total). An asynchronous pair (``all-gather-start`` /
  ``all-gather-done``) counts once, at the ``-done``, whose shape is the result alone (a
  ``-start``'s shape is a tuple of operand and result, and context words); a collective
  wrapped in ``async-start`` is counted inside its wrapped computation. XLA:CPU runs
  collectives synchronously: its text has no ``-start``/``-done``.
* What runs in a ``while`` body runs once per iteration: with the loop's trip count known
  (``backend_config={"known_trip_count":{"n":"5"}}``, what ``lax.scan`` and a
  ``fori_loop`` with static bounds give) the body's collectives, callbacks and custom
  calls are multiplied by it. A loop whose trip count XLA does not know (a
  ``while_loop`` on data) is counted **once**: the record then undercounts that loop.
  Of a conditional's branches, one runs: each quantity is the most any branch has.
* Host callbacks are custom-calls whose target is a Python callback:
  ``xla_ffi_python_cpu_callback`` (``jax.debug.callback``, ``jax.debug.print``,
  ``jax.pure_callback``, ``io_callback`` on CPU; each sits in a conditional that runs it
  on one device only, so one callback is one per step), the ``_gpu_`` and
  ``_partitioned_`` variants, and ``xla_buffer_python_*_callback``. XLA:TPU makes a
  callback a ``send`` of its operands to the host and a ``recv`` of its results
  (``is_host_transfer=true``; checked on libtpu 0.0.42's text for a compile-only v5e): each
  host-transfer ``recv`` is a host callback (one per callback, whose results come back in
  one ``recv`` each; a callback without results still receives one). Every other
  custom-call is a ``custom_calls`` (on GPU that includes cuBLAS matmuls).
* ``ops`` is a static histogram of every instruction in every computation (fused
  computations included, so a dot inside a fusion counts as a ``dot``; loops not
  multiplied), without the bookkeeping that is no work: ``parameter``, ``constant``,
  ``tuple``, ``get-tuple-element``, ``bitcast``. A ``dot`` or ``convolution`` whose
  ``operand_precision`` is not the default carries it in its name (``dot[highest]``: what
  ``jax.default_matmul_precision("highest")`` changes; XLA:CPU keeps the attribute in its
  optimized HLO), and a custom-call its target (``custom-call[__cublas$gemm]``, plus a
  non-default precision from its backend config).

Nothing here raises on text it does not know: an unknown line is skipped, and when a part
cannot be read at all (no cost model, no HLO text) the record leaves that field out
rather than recording a wrong value.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from pytest_accelperf.records.program import ProgramRecord, program_record

if TYPE_CHECKING:
    from jax.stages import Compiled, Lowered

_T = TypeVar("_T")

#: Collective opcodes (their ``-start``/``-done`` forms included) -> the record's kind.
COLLECTIVES: dict[str, str] = {
    "all-reduce": "all-reduce",
    "all-gather": "all-gather",
    "reduce-scatter": "reduce-scatter",
    "all-to-all": "all-to-all",
    "ragged-all-to-all": "all-to-all",
    "collective-permute": "collective-permute",
    "collective-broadcast": "collective-broadcast",
}
#: Opcodes that are bookkeeping, not work: left out of the ``ops`` histogram.
BOOKKEEPING = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})
_HOST_CALLBACK = re.compile(r"python\w*callback|host_callback", re.IGNORECASE)

_HEADER = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-_]*)\(")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_BITS = re.compile(r"[a-z]+?(\d+)")
_CALLED = re.compile(
    r"\b(calls|to_apply|body|condition|true_computation|false_computation|"
    r"branch_computations|called_computations|select|scatter)=(\{[^}]*\}|%?[\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_PRECISION = re.compile(r"operand_precision=\{([^}]*)\}")
_CONFIG_PRECISION = re.compile(r'"operand_precision"\s*:\s*\[([^\]]*)\]')


def program_of(lowered: Lowered | None, compiled: Compiled, n_devices: int, *,
               global_flops: bool = False) -> ProgramRecord:
    """The program record (``source="xla"``) of a jitted step: ``lowered`` is its
    ``jax.stages.Lowered`` (None: no model FLOPs), ``compiled`` its ``Compiled`` for a
    mesh of ``n_devices``; ``global_flops``: ``lowered`` is the step lowered again on one
    device over the global batch (a ``bind_axes`` step), not ``compiled``'s own. What
    cannot be read is left out; this never raises."""
    flops = _safe(model_flops, lowered) if lowered is not None else None
    cost = _safe(_cost, compiled) or {}
    per_device_flops = _number(cost.get("flops"))
    per_device_bytes = _number(cost.get("bytes accessed"))
    text = _safe(_text, compiled)
    hlo = _safe(read_hlo, text) if text else None
    return program_record(
        "xla", flops=flops,
        hardware_flops=per_device_flops * n_devices if per_device_flops else None,
        bytes_accessed=per_device_bytes * n_devices if per_device_bytes else None,
        collectives=hlo.collectives if hlo else None,
        host_callbacks=hlo.host_callbacks if hlo else None,
        custom_calls=hlo.custom_calls if hlo else None,
        ops=hlo.ops if hlo else None, global_flops=global_flops)


def model_flops(lowered: Lowered) -> float | None:
    """FLOPs of one step as the model defines them: the cost analysis of the program
    *before* it is partitioned over the mesh, so compute that the mesh replicates (a
    parameter replicated over ``model``, the optimizer update on every data-parallel
    replica) counts once. Multiplying one device's count by the device count instead gave
    2.01x the model's FLOPs on a 4x2 mesh with parameters replicated over ``model``."""
    try:
        cost = lowered.cost_analysis()
    except (NotImplementedError, RuntimeError):  # a backend without an HLO cost model
        return None
    flops = _number(_first(cost).get("flops"))
    return flops if flops and flops > 0 else None


# -- the HLO text -----------------------------------------------------------------------------
@dataclass
class HloCounts:
    """What :func:`read_hlo` found: per-step counts, and the static op histogram."""

    collectives: dict[str, dict[str, int]] = field(default_factory=dict)
    host_callbacks: int = 0
    custom_calls: int = 0
    ops: dict[str, int] = field(default_factory=dict)
    #: ``while`` loops without a known trip count (their bodies were counted once).
    unknown_trip_counts: int = 0


@dataclass
class _Instruction:
    opcode: str
    shape: str
    attrs: str


@dataclass
class _Computation:
    name: str
    instructions: list[_Instruction] = field(default_factory=list)


def read_hlo(text: str) -> HloCounts:
    """Count what one execution of the HLO module ``text`` (``compiled.as_text()``) does:
    see the module docstring for what is counted and how."""
    computations, entry = _parse(text)
    ops: Counter[str] = Counter()
    unknown = 0
    for comp in computations.values():
        for ins in comp.instructions:
            if ins.opcode not in BOOKKEEPING:
                ops[_op_name(ins)] += 1
            if ins.opcode == "while" and _trip_count(ins.attrs) is None:
                unknown += 1
    totals: dict[str, Counter[str]] = {}
    if entry is None:  # no ENTRY marked: each computation once
        total: Counter[str] = Counter()
        for comp in computations.values():
            total.update(_own(comp))
    else:
        total = _total(entry, computations, totals, set())
    collectives: dict[str, dict[str, int]] = {}
    for key, value in total.items():
        if key.startswith("collective:"):
            _, kind, what = key.split(":")
            collectives.setdefault(kind, {"count": 0, "bytes": 0})[what] = int(value)
    return HloCounts(collectives=collectives, host_callbacks=int(total["host_callbacks"]),
                     custom_calls=int(total["custom_calls"]), ops=dict(ops),
                     unknown_trip_counts=unknown)


def _parse(text: str) -> tuple[dict[str, _Computation], str | None]:
    """The computations of an HLO module by name, and the entry's name."""
    computations: dict[str, _Computation] = {}
    entry: str | None = None
    current: _Computation | None = None
    for line in text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header:
                current = _Computation(header.group(2))
                computations[current.name] = current
                if header.group(1):
                    entry = current.name
            continue
        if line.strip() == "}" and not line.startswith((" ", "\t")):
            current = None
            continue
        ins = _instruction(line)
        if ins is not None:
            current.instructions.append(ins)
    return computations, entry


def _instruction(line: str) -> _Instruction | None:
    match = _INSTRUCTION.match(line)
    if not match:
        return None
    rest = match.group(2)
    if rest.startswith("("):  # a tuple shape: up to its closing parenthesis
        end = _closing(rest)
        if end < 0:
            return None
        shape, rest = rest[:end + 1], rest[end + 1:]
    else:
        shape, _, rest = rest.partition(" ")
    opcode = _OPCODE.match(rest)
    if not opcode:
        return None
    return _Instruction(opcode.group(1), shape, _strip_metadata(rest[opcode.end():]))


def _closing(text: str) -> int:
    """The index of the parenthesis that closes ``text``'s first one; -1 if none does."""
    depth = 0
    for i, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if depth == 0:
            return i
    return -1


def _strip_metadata(attrs: str) -> str:
    """``attrs`` without ``metadata={...}``: source names and paths there are not the
    program's attributes (an ``op_name`` may read ``calls=`` or ``custom_call_target``)."""
    start = attrs.find("metadata={")
    if start < 0:
        return attrs
    depth, quoted, i = 0, False, start + len("metadata=")
    while i < len(attrs):
        char = attrs[i]
        if quoted:
            if char == "\\":
                i += 1
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return attrs[:start] + _strip_metadata(attrs[i + 1:])
        i += 1
    return attrs[:start]


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape: ``f32[16,32]{1,0}`` is 2048, a tuple the sum of its
    elements, ``token[]`` and ``()`` none; a dynamic ``<=16`` dimension at its bound."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(shape):
        if dtype == "pred":
            bits = 8
        else:
            found = _BITS.match(dtype)
            if not found:  # token, opaque: no data
                continue
            bits = int(found.group(1))
        sizes = [int(d.strip().lstrip("<=")) for d in dims.split(",") if d.strip()]
        total += math.prod(sizes) * bits / 8
    return math.ceil(total)


def _trip_count(attrs: str) -> int | None:
    found = _TRIP.search(attrs)
    return int(found.group(1)) if found else None


def _called(attrs: str) -> list[tuple[str, str]]:
    """``(attribute, computation)`` for each computation an instruction calls."""
    out: list[tuple[str, str]] = []
    for key, value in _CALLED.findall(attrs):
        for name in value.strip("{}").split(","):
            name = name.strip().lstrip("%")
            if name:
                out.append((key, name))
    return out


def _own(comp: _Computation) -> Counter[str]:
    """What a computation's own instructions do, once (not what they call)."""
    own: Counter[str] = Counter()
    for ins in comp.instructions:
        base = ins.opcode.removesuffix("-done")
        kind = COLLECTIVES.get(base)
        if kind is not None and not ins.opcode.endswith("-start"):
            # a collective, or the -done of an async one (its shape is the result alone)
            own[f"collective:{kind}:count"] += 1
            own[f"collective:{kind}:bytes"] += shape_bytes(ins.shape)
        elif ins.opcode == "custom-call":
            target = _TARGET.search(ins.attrs)
            if target and _HOST_CALLBACK.search(target.group(1)):
                own["host_callbacks"] += 1
            else:
                own["custom_calls"] += 1
        elif ins.opcode == "recv" and "is_host_transfer=true" in ins.attrs:
            own["host_callbacks"] += 1  # XLA:TPU's callback: results back from the host
    return own


def _total(name: str, computations: Mapping[str, _Computation],
           totals: dict[str, Counter[str]], visiting: set[str]) -> Counter[str]:
    """What one execution of computation ``name`` does, what it calls included."""
    if name in totals:
        return totals[name]
    comp = computations.get(name)
    if comp is None or name in visiting:  # unknown, or a cycle (not in valid HLO)
        return Counter()
    visiting.add(name)
    total = _own(comp)
    for ins in comp.instructions:
        if ins.opcode in ("async-done", "async-update"):
            continue  # the same wrapped computation as its async-start: counted there
        called = _called(ins.attrs)
        if ins.opcode == "while":
            known = _trip_count(ins.attrs)
            trips = 1 if known is None else known  # unknown: once (see the docstring)
            for key, callee in called:
                times = trips + 1 if key == "condition" and known is not None else trips
                for what, value in _total(callee, computations, totals, visiting).items():
                    total[what] += value * times
        elif ins.opcode == "conditional":
            branches = [_total(c, computations, totals, visiting) for _, c in called]
            for what in {w for b in branches for w in b}:
                total[what] += max(b[what] for b in branches)
        else:
            for _, callee in called:
                total.update(_total(callee, computations, totals, visiting))
    visiting.discard(name)
    totals[name] = total
    return total


def _op_name(ins: _Instruction) -> str:
    """The histogram's name of an instruction: the opcode, a non-default precision of a
    dot or convolution in brackets, a custom-call's target."""
    if ins.opcode in ("dot", "convolution"):
        found = _PRECISION.search(ins.attrs)
        precision = _precision(found.group(1)) if found else ""
        return f"{ins.opcode}[{precision}]" if precision else ins.opcode
    if ins.opcode == "custom-call":
        target = _TARGET.search(ins.attrs)
        name = f"custom-call[{target.group(1)}]" if target else "custom-call"
        found = _CONFIG_PRECISION.search(ins.attrs)
        precision = _precision(found.group(1)) if found else ""
        return f"{name}[{precision}]" if precision else name
    return ins.opcode


def _precision(text: str) -> str:
    """``highest`` of ``highest,highest`` (``high,highest`` as given); empty when every
    operand has the default precision."""
    values = [v.strip().strip('"').lower() for v in text.split(",") if v.strip()]
    if not values or all(v == "default" for v in values):
        return ""
    return values[0] if len(set(values)) == 1 else ",".join(values)


# -- helpers ----------------------------------------------------------------------------------
def _cost(compiled: Compiled) -> dict[str, object]:
    return _first(compiled.cost_analysis())


def _first(cost: object) -> dict[str, object]:
    """A cost analysis as one dict (older jax gives a list, one per program)."""
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    return dict(cost) if isinstance(cost, Mapping) else {}


def _text(compiled: Compiled) -> str:
    text = compiled.as_text()
    return text if isinstance(text, str) else ""


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _safe(fn: Callable[..., _T], *args: object) -> _T | None:
    """``fn(*args)``, or None if it raised: a record with a field missing beats a failed
    run."""
    try:
        return fn(*args)
    except Exception:
        return None
