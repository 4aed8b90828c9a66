"""Read a compiled XLA program into a program record (:mod:`pytest_accelperf.records.program`).

:func:`program_of` takes a jitted step's ``Lowered`` and ``Compiled`` and returns
``program_record("xla", ...)``:

``flops``
    the unpartitioned program's cost analysis (:func:`model_flops`): the model's FLOPs,
    compute the mesh replicates counted once.
``hardware_flops``, ``bytes_accessed``
    one device's compiled cost analysis (``flops``, ``bytes accessed``) times the device
    count: what all devices execute and move, replicated work on every replica.
``loops``
    the ``while`` loops whose bodies the three amounts count once per iteration
    (:func:`loop_corrected`). XLA's cost analysis counts a loop's body once, however many
    times it runs: a ``lax.scan`` of ten matmuls costs one matmul there (checked in jax
    0.10.2, lowered and compiled alike), so a scanned RNN, a model scanned over its layers
    or a pipeline's ticks were undercounted by their trip counts, and a change of the trip
    count (more layers, more microbatches) changed no amount. Each loop with a trip count
    XLA knows (``known_trip_count``), or that reads as a ``lax.scan``'s (a counter from a
    constant, below a constant), adds ``trip count - 1`` times its body's own cost (XLA's
    cost analysis of the body alone) times the executions of the computation it is in.
    Where jaxlib offers no way to cost a body alone, the amounts stay XLA's and ``loops``
    is left out.
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

import importlib
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

_HEADER = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*(?:\(.*)?\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$")
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
    # Each loop's body per iteration (XLA counts it once): the compiled program's for the
    # hardware amounts, the lowered one's for the model's FLOPs (XLA may unroll a loop).
    loops = None
    extra = _safe(loop_corrected, text, lambda: _compiled_client(compiled)) if text else None
    model_extra = _safe(lowered_loops, lowered) if flops and lowered else NO_LOOPS
    if extra is not None and model_extra is not None and (extra.loops or model_extra.loops):
        loops = max(extra.loops, model_extra.loops)
        per_device_flops = (per_device_flops or 0.0) + extra.flops or None
        per_device_bytes = (per_device_bytes or 0.0) + extra.bytes or None
        flops = flops + model_extra.flops if flops else flops
    return program_record(
        "xla", flops=flops,
        hardware_flops=per_device_flops * n_devices if per_device_flops else None,
        bytes_accessed=per_device_bytes * n_devices if per_device_bytes else None,
        collectives=hlo.collectives if hlo else None,
        host_callbacks=hlo.host_callbacks if hlo else None,
        custom_calls=hlo.custom_calls if hlo else None,
        ops=hlo.ops if hlo else None, global_flops=global_flops, loops=loops)


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


# -- loops ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoopExtra:
    """What :func:`loop_corrected` adds to XLA's cost analysis of a module: the loops it
    counted per iteration, and the FLOPs and bytes of their iterations beyond the first."""

    loops: int
    flops: float
    bytes: float


NO_LOOPS = LoopExtra(0, 0.0, 0.0)


def loop_corrected(text: str, client: Callable[[], object]) -> LoopExtra | None:
    """What the ``while`` loops of the HLO module ``text`` add to XLA's cost analysis of
    it, which counts each body once: for each loop of a known trip count ``n`` (see the
    module docstring), ``(n - 1)`` times its body's own cost (XLA's cost analysis of the
    body as the entry, with the backend ``client()``) times the executions of the
    computation that holds it. :data:`NO_LOOPS` for a module without such loops; None
    where a body cannot be costed (no such API in this jaxlib): then nothing is added."""
    computations, entry = _parse(text)
    if entry is None:
        return NO_LOOPS
    runs = _executions(entry, computations)
    loops: list[tuple[str, int, int]] = []  # (body, trip count, executions of its holder)
    for name, comp in computations.items():
        for ins in comp.instructions:
            if ins.opcode != "while" or name not in runs:
                continue
            trips = _trip_count(ins.attrs)
            if trips is None:
                trips = _scan_trip_count(ins, comp, computations)
            body = dict(_called(ins.attrs)).get("body")
            if trips is not None and body is not None:
                loops.append((body, trips, runs[name]))
    if not loops:
        return NO_LOOPS
    cost_of = _module_cost()
    if cost_of is None:
        return None
    backend = client()
    flops = bytes_ = 0.0
    for body, trips, times in loops:
        if trips <= 1:
            continue
        cost = _first(cost_of(backend, _as_entry(text, body, computations)))
        flops += (trips - 1) * times * (_number(cost.get("flops")) or 0.0)
        bytes_ += (trips - 1) * times * (_number(cost.get("bytes accessed")) or 0.0)
    return LoopExtra(len(loops), flops, bytes_)


def lowered_loops(lowered: Lowered) -> LoopExtra | None:
    """:func:`loop_corrected` of a lowered (unoptimized) program: what its loops add to
    :func:`model_flops`."""
    return loop_corrected(_lowered_text(lowered), lambda: _lowered_backend(lowered))


def counted_model_flops(lowered: Lowered) -> float | None:
    """:func:`model_flops` with each loop's body counted per iteration; None where either
    cannot be read (a count that undercounts its loops is no count)."""
    flops = model_flops(lowered)
    extra = _safe(lowered_loops, lowered) if flops else None
    return None if flops is None or extra is None else flops + extra.flops


def _executions(entry: str, computations: Mapping[str, _Computation]) -> dict[str, int]:
    """How many times each computation reachable from ``entry`` runs in one execution of
    it: a ``while`` body (and condition) its trip count times (once where unknown); a
    computation called from several places, the most of them."""
    runs: dict[str, int] = {}

    def visit(name: str, times: int, path: frozenset[str]) -> None:
        comp = computations.get(name)
        if comp is None or name in path or runs.get(name, 0) >= times:
            return
        runs[name] = times
        for ins in comp.instructions:
            trips = 1
            if ins.opcode == "while":
                known = _trip_count(ins.attrs)
                if known is None:
                    known = _scan_trip_count(ins, comp, computations)
                trips = known or 1
            for key, callee in _called(ins.attrs):
                visit(callee, times * (trips if key in ("body", "condition") else 1),
                      path | {name})

    visit(entry, 1, frozenset())
    return runs


def _scan_trip_count(ins: _Instruction, comp: _Computation,
                     computations: Mapping[str, _Computation]) -> int | None:
    """The trip count of a ``while`` as ``lax.scan`` and a static ``fori_loop`` lower it,
    before XLA annotates it: the condition's root is ``compare(element i of its
    parameter, constant N), direction=LT``, element i of the loop's initial tuple is
    ``constant S`` and the body adds 1 to it: N - S. None for any other loop."""
    called = dict(_called(ins.attrs))
    cond = computations.get(called.get("condition", ""))
    if cond is None or not cond.instructions:
        return None
    by_name = {i.name: i for i in cond.instructions}
    root = next((i for i in cond.instructions if i.root), None)
    if root is None or root.opcode != "compare" or "direction=LT" not in root.attrs:
        return None
    operands = _operands(root.attrs)
    if len(operands) != 2:
        return None
    counter, bound = (by_name.get(o) for o in operands)
    if counter is None or bound is None or counter.opcode != "get-tuple-element":
        return None
    index = re.search(r"\bindex=(\d+)", counter.attrs)
    limit = _constant(bound)
    init_name = (_operands(ins.attrs) or [""])[0]
    init = next((i for i in comp.instructions if i.name == init_name), None)
    if index is None or limit is None or init is None or init.opcode != "tuple":
        return None
    elements = _operands(init.attrs)
    i = int(index.group(1))
    start_ins = next((x for x in comp.instructions
                      if i < len(elements) and x.name == elements[i]), None)
    start = _constant(start_ins) if start_ins is not None else None
    if start is None or limit - start < 0 or not _steps_by_one(
            computations.get(called.get("body", "")), int(index.group(1))):
        return None
    return limit - start


def _steps_by_one(body: _Computation | None, i: int) -> bool:
    """Whether ``body`` returns element ``i`` of its parameter plus the constant 1 (a
    scan's counter; a loop that steps by 2 runs half as many times)."""
    if body is None:
        return False
    by_name = {x.name: x for x in body.instructions}
    root = next((x for x in body.instructions if x.root), None)
    if root is None or root.opcode != "tuple":
        return False
    elements = _operands(root.attrs)
    step = by_name.get(elements[i]) if i < len(elements) else None
    if step is None or step.opcode != "add":
        return False
    parts = [by_name.get(o) for o in _operands(step.attrs)]
    counter = [x for x in parts if x is not None and x.opcode == "get-tuple-element"
               and re.search(rf"\bindex={i}\b", x.attrs)]
    one = [x for x in parts if x is not None and _constant(x) == 1]
    return len(parts) == 2 and len(counter) == 1 and len(one) == 1


def _operands(attrs: str) -> list[str]:
    """The operand names of an instruction (``attrs`` begins after its opcode's
    parenthesis): ``a, b), direction=LT`` gives ``[a, b]``."""
    depth, end = 1, len(attrs)
    for k, char in enumerate(attrs):
        depth += (char == "(") - (char == ")")
        if depth == 0:
            end = k
            break
    names = []
    for part in attrs[:end].split(","):
        words = part.strip().split()
        if words:  # "f32[2]{0} %x" in some dumps, "x" in others
            names.append(words[-1].lstrip("%"))
    return names


def _constant(ins: _Instruction) -> int | None:
    """The value of an integer scalar ``constant(N)``; None for anything else."""
    if ins.opcode != "constant" or not re.fullmatch(r"[su]\d+\[\](\{\})?", ins.shape):
        return None
    found = re.match(r"\s*(-?\d+)\s*\)", ins.attrs)
    return int(found.group(1)) if found else None


def _as_entry(text: str, body: str, computations: Mapping[str, _Computation]) -> str:
    """The module ``text`` cut to computation ``body`` as its entry and what it calls (a
    large model's module is parsed once a loop: only the loop's part of it), the header
    without its attributes (the entry's layout and aliasing are the old entry's)."""
    keep: set[str] = set()
    todo = [body]
    while todo:
        name = todo.pop()
        if name in keep or name not in computations:
            continue
        keep.add(name)
        todo.extend(c for ins in computations[name].instructions for _, c in _called(ins.attrs))
    out = []
    inside: bool | None = None  # in a computation's block: whether it is kept
    for line in text.splitlines():
        if inside is not None:
            if inside:
                out.append(line)
            if line.strip() == "}" and not line.startswith((" ", "\t")):
                inside = None
            continue
        header = _HEADER.match(line)
        if header:
            inside = header.group(2) in keep
            if inside:
                line = line.removeprefix("ENTRY ")
                out.append("ENTRY " + line if header.group(2) == body else line)
            continue
        out.append(line.split(",", 1)[0] if line.startswith("HloModule ") else line)
    return "\n".join(out)


def _module_cost() -> Callable[[object, str], object] | None:
    """``cost(backend, text)``: XLA's cost analysis of an HLO module given as text, with
    ``backend``'s cost model (what ``Lowered.cost_analysis`` calls); None where this
    jaxlib has no such functions (private ones: their home moved in jaxlib 0.6)."""
    def imported(module: str) -> object:
        try:
            return importlib.import_module(module)
        except ImportError:
            return None

    lib = imported("jax._src.lib")
    homes = [imported("jaxlib._hlo"), getattr(lib, "_jax", None),  # jaxlib 0.6 and after
             getattr(getattr(lib, "xla_client", None), "_xla", None)]  # before

    def found(name: str) -> Callable[..., object] | None:
        return next((getattr(h, name) for h in homes
                     if h is not None and callable(getattr(h, name, None))), None)

    parse, cost = found("hlo_module_from_text"), found("hlo_module_cost_analysis")
    if parse is None or cost is None:
        return None
    return lambda backend, text: cost(backend, parse(text))


def _compiled_client(compiled: Compiled) -> object:
    executable = compiled.runtime_executable()
    return None if executable is None else executable.client


def _lowered_backend(lowered: Lowered | None) -> object:
    """The backend ``Lowered.cost_analysis`` itself uses."""
    return lowered._lowering.compile_args["backend"]  # type: ignore[union-attr]


def _lowered_text(lowered: Lowered | None) -> str:
    text = lowered.as_text(dialect="hlo") if lowered is not None else ""
    return text if isinstance(text, str) else ""


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
    #: ``while`` loops in all.
    loops: int = 0


@dataclass
class _Instruction:
    opcode: str
    shape: str
    attrs: str
    name: str = ""
    root: bool = False


@dataclass
class _Computation:
    name: str
    instructions: list[_Instruction] = field(default_factory=list)


def read_hlo(text: str) -> HloCounts:
    """Count what one execution of the HLO module ``text`` (``compiled.as_text()``) does:
    see the module docstring for what is counted and how."""
    computations, entry = _parse(text)
    ops: Counter[str] = Counter()
    unknown = loops = 0
    for comp in computations.values():
        for ins in comp.instructions:
            if ins.opcode not in BOOKKEEPING:
                ops[_op_name(ins)] += 1
            if ins.opcode == "while":
                loops += 1
                unknown += _trip_count(ins.attrs) is None
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
                     unknown_trip_counts=unknown, loops=loops)


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
    rest = match.group(3)
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
    return _Instruction(opcode.group(1), shape, _strip_metadata(rest[opcode.end():]),
                        name=match.group(2), root=bool(match.group(1)))


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
