"""The DeepSpeed backend: ZeRO stages 0-3, optional CPU offload, ``world_size`` ranks.

A ``backend="deepspeed"`` case trains a
:class:`~pytest_accelperf.backends.torch.rank_step.RankStep` (the user's own ``build(rank) ->
(model, optimizer, scheduler)`` and loss) or a
:class:`~pytest_accelperf.backends.torch.task.TorchTask` (the same task the torch backend
trains, converted to one) with ``deepspeed.initialize`` in
``case.world_size`` processes that the plugin launches itself (no ``deepspeed`` or
``torchrun`` launcher: :mod:`pytest_accelperf.backends.procs.launch`; gloo on the CPU, nccl on
GPUs), or as Ray actors. The rank loop (:mod:`pytest_accelperf.backends.torch.in_rank`), what
is measured and how (:mod:`pytest_accelperf.backends.torch.processes`), are shared with DDP;
this module builds the
engine, and its ``RANKS`` is what the backend's spec names as its ranks.

The DeepSpeed configuration comes from the case (:func:`ds_config`):

* ``train_batch_size = case.batch`` (the global batch of one optimizer step),
  ``gradient_accumulation_steps = case.grad_accum``, ``train_micro_batch_size_per_gpu =
  case.batch / (world_size * grad_accum)``;
* ``zero_optimization.stage = case.zero_stage``; ``offload_optimizer`` (``case.offload`` in
  ``optimizer``/``all``) and ``offload_param`` (``param``/``all``, stage 3) to the CPU;
* ``gradient_clipping`` always explicit: ``case.grad_clip`` (or the task's), 0 for none:
  DeepSpeed's own default (1.0) is never used by accident;
* fp32 (``case.params["precision"] = "bf16"`` turns on DeepSpeed's bf16 on GPUs);
* ``case.params["ds_config"]`` and then the step's ``ds_config``: dicts merged over all
  this, except the batch, accumulation and clipping keys, which come from the case;
* in the rank, once the model exists: each ZeRO size of :data:`SIZED_KEYS` that nobody set
  (the buckets; at ZeRO-3 also the prefetch, live-parameter, reuse-distance and persistence
  limits and ``sub_group_size``) becomes an eighth of a rank's share of the parameters, at
  least 65,536 elements, at most the model and DeepSpeed's own default
  (:func:`size_buckets`), listed in the run's ``extra["engine"]["plugin_set"]``. With
  these, per-rank memory falls with the stage
  (``tests/unit/backends/torch/test_deepspeed_memory.py``).

Optimizer and schedule: the user's own (``build``), as a client optimizer and
``lr_scheduler``, so no C++ op is compiled for it and the engine steps the schedule once per
optimizer step. With the optimizer offloaded, a torch ``Adam``/``AdamW`` is replaced by
``DeepSpeedCPUAdam`` with the same hyper-parameters (what DeepSpeed requires of offload);
any other optimizer is kept (``zero_force_ds_cpu_optimizer: false``); a scheduler follows
it. ``case.zero_init`` (ZeRO-3) builds the model inside ``deepspeed.zero.Init`` so that each
rank holds only its partition from the start, as it must for a model that does not fit one
device; off by default, as DeepSpeed recommends for a model that fits (a model's own init
after construction, and optimizer groups made by ``p.dim()``, see empty tensors inside it).
``compile=True`` calls DeepSpeed's ``engine.compile()`` (after the counted steps, see
:mod:`.torch.in_rank`).

C++ ops: DeepSpeed compiles ``deepspeed_shm_comm`` (the CPU accelerator's shared-memory
collectives, at ``init_distributed`` on the CPU) and ``cpu_adam`` (for offload) on first use,
about a minute each on two cores, into ``TORCH_EXTENSIONS_DIR``: by default the persistent
``~/.cache/pytest-accelperf/torch_extensions`` (see :mod:`.launch`), so once per machine.
Ninja would build them again for every new virtual environment (its files are newer than the
build): a build is also recorded with a key of what it was built from, and a rank whose
sources and releases have that key loads it as it is (:func:`preload_ops`).

Memory (``memory_per_device = {"rank0": ..., "rank1": ...}``): on GPUs each rank's
``torch.cuda.max_memory_allocated``, where offload shows as fewer device bytes. On the CPU
each rank's MemTracker count of live tensor bytes over construction and the first two
steps: there the "device" *is* the CPU, so offloaded optimizer state or parameters are
still counted (offload moves them to the same memory); what ZeRO partitions away from a
rank does disappear from its count.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from pytest_accelperf.backends.procs.ranks import train_in_ranks
from pytest_accelperf.backends.protocol import Fit, Task, TrainResult
from pytest_accelperf.backends.torch.comm import CommCounter, count_deepspeed
from pytest_accelperf.backends.torch.in_rank import EngineDescription, RankPlan
from pytest_accelperf.backends.torch.processes import TorchRanks, micro_batch, resolve_clip
from pytest_accelperf.backends.torch.rank_step import RankStep, compiled_graphs, group_summary
from pytest_accelperf.backends.types import Framework, FrameworkKwargs
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator

INSTALL = "pip install 'pytest-accelperf[deepspeed]' (DeepSpeed 0.19; torch first)"
#: Keys of ``params["ds_config"]`` that the case itself decides.
_CASE_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu",
              "gradient_accumulation_steps", "gradient_clipping")


def import_deepspeed() -> Framework:
    """The ``deepspeed`` module (untyped; imported only in the ranks, never in pytest's
    process, where its import-time warnings would meet ``filterwarnings = error``)."""
    return importlib.import_module("deepspeed")


def _merge(base: FrameworkKwargs, over: Mapping[str, Any]) -> FrameworkKwargs:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _same(given: object, implied: float) -> bool:
    """Whether a config's value of a case key is the one the case implies (a config
    written for the same batch and clipping, as DeepSpeed's tutorials write theirs)."""
    if isinstance(given, bool) or not isinstance(given, int | float):
        return False
    return float(given) == float(implied)


def ds_config(case: Case, grad_clip: float | None, device: str = "cpu",
              extra: Mapping[str, Any] | None = None) -> FrameworkKwargs:
    """The DeepSpeed config of ``case`` (see the module doc): what the case implies, then
    ``case.params["ds_config"]``, then ``extra`` (the ``RankStep``'s ``ds_config``) merged
    over it; a key set by either wins, except the batch, accumulation and clipping keys,
    which come from the case (a config may repeat them with the case's values: DeepSpeed's
    CIFAR-10 tutorial's sets ``train_batch_size`` 16 and ``gradient_clipping`` 1.0; any
    other value is a :class:`ConfigError` naming both)."""
    stage = case.zero_stage or 0
    if stage == 0 and case.offload != "none":
        raise ConfigError(f"{case.id}: offload={case.offload!r} needs ZeRO stage 1 or more "
                         f"(DeepSpeed offloads partitioned state); set zero_stage")
    zero: FrameworkKwargs = {"stage": stage}
    pin = device == "cuda"  # pinned host memory only helps device transfers
    if case.offload in ("optimizer", "all"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if case.offload in ("param", "all"):
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    precision = str(case.params.get("precision", "fp32"))
    if precision not in ("fp32", "bf16"):
        raise ConfigError(f"{case.id}: params['precision'] is 'fp32' or 'bf16', not "
                         f"{precision!r}")
    config: FrameworkKwargs = {
        "train_batch_size": case.batch,
        "train_micro_batch_size_per_gpu": micro_batch(case),
        "gradient_accumulation_steps": case.grad_accum,
        "gradient_clipping": float(grad_clip or 0.0),
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    for where, over in (("params['ds_config']", case.params.get("ds_config", {})),
                        ("RankStep.ds_config", extra or {})):
        if not isinstance(over, Mapping):
            raise ConfigError(f"{case.id}: {where} must be a dict, not {type(over).__name__}")
        clash = [f"{key} {over[key]!r} where the case gives {config[key]!r}"
                 for key in _CASE_KEYS if key in over and not _same(over[key], config[key])]
        if clash:
            raise ConfigError(f"{case.id}: {where} sets {'; '.join(clash)}: these come from "
                             f"the case (batch, world_size, grad_accum, grad_clip): set "
                             f"them on the Case, or leave them out of the config")
        config = _merge(config, over)
    return config


#: ZeRO sizes (``zero_optimization`` keys, DeepSpeed's field names) that the plugin sizes
#: from the model when neither the case nor the step sets them (:func:`size_buckets`).
#: DeepSpeed's defaults are for billions of parameters: a 5e8-element bucket is 1.86 GiB of
#: fp32 per rank whatever the model, and 1e9 live parameters or reuse distance keep a whole
#: ZeRO-3 model gathered. Sizing them to the model alone (``min(default, model)``, what
#: the plugin did first) still made ZeRO-3 use *more* memory than ZeRO-0 (23.4 against 20.0
#: bytes a parameter for a 3.1 M-parameter MLP at world size 2: a model-sized reduce
#: bucket, its flat copy and gloo's copy of it at the reduce-scatter, 12 bytes a parameter);
#: with only the buckets smaller, ZeRO-3's optimizer step over the whole partition (its fp32
#: gradient and torch Adam's two temporaries) was still above ZeRO-2's peak (16.27 against
#: 16.02). So each is a fraction of a rank's share:
#:
#: * the buckets (ZeRO 1-3), what ZeRO-3 prefetches, keeps gathered and re-uses, and
#:   the total it leaves unpartitioned (``stage3_model_persistence_threshold``: DeepSpeed
#:   keeps every tensor under ``stage3_param_persistence_threshold``, 1e5 elements, whole on
#:   every rank, with no cap; a model of many small tensors would not be partitioned at
#:   all);
#: * ``sub_group_size`` (ZeRO-3 steps the optimizer one sub-group at a time: a sub-group of
#:   the whole partition holds its flat fp32 gradient copy and the optimizer's temporaries
#:   for all of it at once, more than ZeRO-2's step).
BUCKET_KEYS = ("reduce_bucket_size", "allgather_bucket_size")
STAGE3_KEYS = ("stage3_prefetch_bucket_size", "stage3_max_live_parameters",
               "stage3_max_reuse_distance", "stage3_model_persistence_threshold",
               "sub_group_size")
SIZED_KEYS = BUCKET_KEYS + STAGE3_KEYS

#: A sized key is this fraction (1 / ``BUCKET_FRACTION``) of one rank's share of the
#: parameters: each bucket-sized buffer then costs ``4 / (8 N)`` bytes a parameter (0.25 at
#: world size 2), one to three of which are live at a stage's peak, small against what the
#: stages save (ZeRO-3 5.7 bytes a parameter under ZeRO-0 for that MLP, 8.2-8.5 for models of
#: smaller layers: docs/backends.md).
BUCKET_FRACTION = 8
#: ... but never fewer elements than this (256 KiB of fp32), so that a small model or many
#: ranks do not cut a step's gradients into hundreds of latency-bound collectives; and never
#: more than the model (a bucket never needs to hold more than all of it) nor DeepSpeed's
#: own default (a model of billions keeps DeepSpeed's sizes).
BUCKET_FLOOR = 1 << 16

#: Sized values are rounded up to a multiple of this many elements: ZeRO 1-2 assert that
#: ``allgather_bucket_size`` is a multiple of their 4-byte alignment factor (2 elements),
#: and DeepSpeed's own defaults are multiples of it.
ALIGN = 256


def _align(n: int) -> int:
    return -(-max(int(n), 1) // ALIGN) * ALIGN


def bucket_elements(n_params: int, world_size: int) -> int:
    """The size the plugin gives every key of :data:`SIZED_KEYS` (before DeepSpeed's own
    default caps it): ``1 / BUCKET_FRACTION`` of a rank's share of ``n_params``, at least
    :data:`BUCKET_FLOOR`, at most the model, rounded up to :data:`ALIGN`."""
    share = -(-int(n_params) // max(int(world_size), 1))
    return min(_align(n_params), max(BUCKET_FLOOR, _align(-(-share // BUCKET_FRACTION))))


def size_buckets(config: FrameworkKwargs, n_params: int, defaults: Mapping[str, int],
                 world_size: int) -> dict[str, int]:
    """Set in ``config["zero_optimization"]`` each of :data:`SIZED_KEYS` that it lacks to
    ``min(defaults[key], bucket_elements(n_params, world_size))`` (ZeRO stages 1-3,
    :data:`STAGE3_KEYS` at 3 only; stage 0 has no ZeRO buffers); returns what it set. A
    key already in the config (the user's) is never changed."""
    zero = config.setdefault("zero_optimization", {})
    stage = int(zero.get("stage", 0))
    if stage == 0:
        return {}
    keys = BUCKET_KEYS + (STAGE3_KEYS if stage == 3 else ())
    bucket = bucket_elements(n_params, world_size)
    set_here: dict[str, int] = {}
    for key in keys:
        if key in zero or key not in defaults:
            continue
        zero[key] = set_here[key] = min(int(defaults[key]), bucket)
    return set_here


def zero_defaults() -> dict[str, int]:
    """DeepSpeed's own defaults of :data:`SIZED_KEYS` (from its ZeRO config model), by
    config key; in a rank only (imports DeepSpeed)."""
    config_module = importlib.import_module("deepspeed.runtime.zero.config")
    model = config_module.DeepSpeedZeroConfig
    out: dict[str, int] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        if key in SIZED_KEYS and isinstance(info.default, int):
            out[key] = int(info.default)
    return out


#: DeepSpeed's C++ ops a CPU rank loads (builder class, extension name): the shared-memory
#: collectives (at ``init_distributed``), the CPU Adam of optimizer offload, and the fused
#: Adam that a config's ``"optimizer": {"type": "AdamW"}`` builds on the CPU.
CPU_OPS = (("ShareMemCommBuilder", "deepspeed_shm_comm"), ("CPUAdamBuilder", "cpu_adam"),
           ("FusedAdamBuilder", "fused_adam"))


class OpBuilder(Protocol):
    """What :func:`op_key` and :func:`load_keyed_op` read of a DeepSpeed op builder
    (``deepspeed.ops.op_builder.builder.OpBuilder``, untyped)."""

    name: str

    def sources(self) -> list[str]: ...

    def include_paths(self) -> list[str]: ...

    def deepspeed_src_path(self, code_path: str) -> str: ...


#: Beside an op's build (its directory in ``TORCH_EXTENSIONS_DIR``): the :func:`op_key` of
#: what it was built from, written once ninja found the build current (:func:`preload_ops`),
#: with the extension's time stamp and size then (:func:`write_op_key`).
OP_KEY_FILE = "accelperf-op-key"


def preload_ops(ninja: bool = True) -> list[str]:
    """In a pool's warm rank (:mod:`.rank_pool`): load those of :data:`CPU_OPS` that this
    machine has already built (in ``TORCH_EXTENSIONS_DIR``), so that every case forked from
    it finds them loaded (DeepSpeed keeps loaded ops per process) instead of checking the
    build and importing the extension again: about 4 s per rank for ``cpu_adam`` on a
    loaded 2-core machine. Loading runs no op (no process group, no shared memory, no
    optimizer). An op that would be *built* here is left to the case that needs it
    (:func:`op_is_built`): never built, out of date for ninja (a build that was killed
    midway leaves its objects newer than its log), or locked by a build under way (or by
    one that was killed: torch's lock file then stays, and torch waits on it forever).
    A warm rank is killed with its pool whenever a case fails or times out, so a build
    here, of minutes, was killed midway again and again (seen 2026-11-29: ``cpu_adam``
    rebuilt in every DeepSpeed pool's start, its lock left behind by a pool killed at a
    test's 25 s timeout, and every later rank on the machine waiting on it until its own
    timeout), and for an op (``cpu_adam``) that only offloading cases use. Once ninja has
    found a build current, its :func:`op_key` is written beside it: a later warm rank whose
    key is the same loads it without ninja (:func:`load_keyed_op`), which is what lets a
    fresh virtual environment of the same releases (every CI run's) use the machine's builds
    rather than compile three ops again (2-3 minutes of a loaded 2-core machine each; CI
    rebuilt them in every run, 2026-11-30). ``ninja=False`` (a freshly launched CPU rank,
    before DeepSpeed loads an op itself): only the recorded builds, nothing asked of ninja.
    Returns the names loaded."""
    global _preloaded
    if not os.environ.get("TORCH_EXTENSIONS_DIR"):
        return []
    accelerator = importlib.import_module("deepspeed.accelerator").get_accelerator()
    if accelerator.device_name() != "cpu":
        return []
    cache = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    loaded = []
    for builder_name, op in CPU_OPS:
        built = [so.parent for so in cache.glob(f"**/{op}.so")]
        if not built or (built[0] / "lock").exists():
            continue
        builder = accelerator.create_op_builder(builder_name)
        if builder is None:
            continue
        key = op_key(builder)
        if load_keyed_op(builder, built[0], key):
            loaded.append(op)
        elif ninja and op_is_built(built[0]):
            builder.load(verbose=False)
            write_op_key(built[0], builder.name, key)  # ninja found it built from this
            loaded.append(op)
    _preloaded = True
    return loaded


#: Whether :func:`preload_ops` ran in this process (a warm rank's, before it forks a case).
_preloaded = False


def op_key(builder: OpBuilder) -> str:
    """What a DeepSpeed op's build depends on: its sources' and DeepSpeed's headers' bytes,
    the versions of torch (whose headers and libraries it is built against), DeepSpeed
    (whose builder picks the flags) and Python, and the CPU (the flags DeepSpeed picks for
    it: ``-march``, SIMD width; read from ``/proc/cpuinfo``, not by ``builder.cxx_args()``,
    which takes 3 s of CPU detection per op). The same key in another environment (CI's
    fresh venv of the same releases) is the same build, which ninja would still redo: it
    compares time stamps, and a fresh install's files are all newer than the cached build."""
    cpu = Path("/proc/cpuinfo")
    cpu_flags = sorted({line for line in (cpu.read_text().splitlines() if cpu.is_file() else [])
                        if line.startswith(("flags", "model name", "vendor_id"))})
    digest = hashlib.sha256(json.dumps([
        builder.name, torch.__version__, importlib.metadata.version("deepspeed"), sys.version,
        platform.machine(), cpu_flags]).encode())
    files = [Path(builder.deepspeed_src_path(s)) for s in builder.sources()]
    for include in builder.include_paths():
        files += sorted(p for p in Path(builder.deepspeed_src_path(include)).rglob("*")
                        if p.is_file())
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _op_stamp(so: Path, key: str) -> str:
    stat = so.stat()
    return f"{key} {stat.st_mtime_ns} {stat.st_size}"


def write_op_key(directory: Path, name: str, key: str) -> None:
    """Record that the extension ``name`` built in ``directory`` is built from ``key``
    (:data:`OP_KEY_FILE`), with its time stamp and size: a later build there (ninja's, from
    other sources) changes them, and the record no longer holds."""
    tmp = directory / f"{OP_KEY_FILE}.{os.getpid()}"
    tmp.write_text(_op_stamp(directory / f"{name}.so", key))
    tmp.replace(directory / OP_KEY_FILE)


def load_keyed_op(builder: OpBuilder, directory: Path, key: str) -> bool:
    """Load the op built in ``directory`` without asking ninja, when the build's record
    (:func:`write_op_key`) is ``key`` and the extension is the one recorded: import it and
    hand it to DeepSpeed's table of loaded ops, where ``builder.load()`` finds it (as it
    does after a build). Whether it did."""
    so = directory / f"{builder.name}.so"
    stamp = directory / OP_KEY_FILE
    if not so.is_file() or not stamp.is_file() or stamp.read_text() != _op_stamp(so, key):
        return False
    spec = importlib.util.spec_from_file_location(builder.name, so)
    if spec is None or spec.loader is None:
        return False
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    owner = next(c for c in type(builder).__mro__ if "_loaded_ops" in vars(c))
    loaded: dict[str, object] = vars(owner)["_loaded_ops"]
    loaded[builder.name] = module
    return True


def op_is_built(directory: Path) -> bool:
    """Whether the torch extension built in ``directory`` loads without building: no build
    holds torch's lock there (``lock``) and ninja has no work to do (``ninja -n``, a dry
    run: it reads the build's log and time stamps, and writes nothing)."""
    ninja = shutil.which("ninja")
    if ninja is None or (directory / "lock").exists() or \
            not (directory / "build.ninja").is_file():
        return False
    try:
        dry = subprocess.run([ninja, "-n", "-C", str(directory)], capture_output=True,
                             text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return dry.returncode == 0 and "no work to do" in dry.stdout


def _offload_optimizer(client: torch.optim.Optimizer) -> tuple[torch.optim.Optimizer, bool]:
    """``DeepSpeedCPUAdam`` with ``client``'s groups and hyper-parameters when ``client`` is
    a torch Adam/AdamW (second: whether DeepSpeed must accept a client CPU optimizer)."""
    if not isinstance(client, torch.optim.Adam):
        return client, False
    DeepSpeedCPUAdam = importlib.import_module("deepspeed.ops.adam").DeepSpeedCPUAdam

    groups = client.param_groups
    if any(g.get("amsgrad") for g in groups):
        raise ConfigError("DeepSpeedCPUAdam (needed to offload the optimizer) has no amsgrad: "
                         "use amsgrad=False or offload='none'")
    decoupled = isinstance(client, torch.optim.AdamW) or bool(
        groups[0].get("decoupled_weight_decay"))
    params = [{"params": g["params"], "lr": g["lr"], "betas": g["betas"], "eps": g["eps"],
               "weight_decay": g["weight_decay"]} for g in groups]
    first = params[0]
    optimizer: torch.optim.Optimizer = DeepSpeedCPUAdam(
        params, lr=first["lr"], betas=first["betas"], eps=first["eps"],
        weight_decay=first["weight_decay"], adamw_mode=decoupled)
    return optimizer, True


class DeepSpeedRankEngine:
    """One rank's ``DeepSpeedEngine`` (built inside the rank; see the module doc): the
    user's model, optimizer and scheduler through ``deepspeed.initialize(model=...,
    optimizer=..., lr_scheduler=...)``; ``engine.backward(loss)`` and ``engine.step()``
    after every micro-batch, as DeepSpeed's docs write the loop (the engine steps the
    optimizer and the schedule at accumulation boundaries)."""

    #: What a pool's warm ranks import for DeepSpeed cases (its import is most of a fresh
    #: rank's start), and the ops they load (:func:`preload_ops`). The modules after
    #: ``deepspeed.comm`` are those ``deepspeed.initialize`` imports on first use (inductor
    #: and AOT autograd for its compile support, expert parallelism, offload, Muon: 600
    #: modules, 1.5-3 s a rank at every engine's construction); a name that a DeepSpeed
    #: version lacks is skipped by the warm rank. DDP's modules are among them, so that a
    #: DDP case with no pool of its own runs in these warm ranks (:mod:`.rank_pool`).
    warm_modules: tuple[str, ...] = (
        "torch.nn.parallel", "pytest_accelperf.backends.torch.ddp",
        "deepspeed", "deepspeed.comm", "torch._inductor.compile_fx",
        "torch._functorch.aot_autograd", "deepspeed.module_inject.auto_ep_layer",
        "deepspeed.moe.ep_experts", "deepspeed.runtime.superoffload.superoffload_stage3",
        "deepspeed.runtime.zero.muon.muon_optimizer", "deepspeed.comm.mori",
        "deepspeed.ops.triton_ops", "pytest_accelperf.backends.torch.deepspeed:preload_ops")

    def __init__(self, plan: RankPlan, device: torch.device, rank: int) -> None:
        deepspeed = import_deepspeed()

        case, step = plan.case, plan.step
        self.stage = case.zero_stage or 0
        self.step_spec = step
        self.config = ds_config(case, plan.grad_clip, device.type, step.ds_config)
        self.zero_init = case.zero_init
        torch.manual_seed(step.seed)
        from_config = "optimizer" in self.config  # DeepSpeed builds it, as its tutorials do
        if case.zero_init:
            with deepspeed.zero.Init(config_dict_or_path=self.config):
                built = step.built(rank, config_optimizer=from_config)
            module = built.model
        else:
            built = step.built(rank, config_optimizer=from_config)
            module = built.model.to(device)
        n_params = sum(int(getattr(p, "ds_numel", p.numel())) for p in module.parameters())
        self.sized = size_buckets(self.config, n_params, zero_defaults(), case.world_size)
        optimizer = built.optimizer
        scheduler = built.scheduler
        if optimizer is None:  # the config's: DeepSpeed offloads its own Adam itself
            engine, _, _, _ = deepspeed.initialize(
                model=module, model_parameters=[p for p in module.parameters()
                                                if p.requires_grad],
                config=self.config, dist_init_required=False)
            made = getattr(engine, "basic_optimizer", None) or engine.optimizer
            self.groups = group_summary(made)
            self.optimizer_name = f"{type(made).__name__} (from the config)"
            schedule = getattr(engine, "lr_scheduler", None)
            self.scheduler_name = (f"{type(schedule).__name__} (from the config)"
                                   if schedule is not None else None)
        else:
            self.groups = group_summary(optimizer)
            if case.offload in ("optimizer", "all"):
                optimizer, is_ds_adam = _offload_optimizer(optimizer)
                if not is_ds_adam:
                    self.config["zero_force_ds_cpu_optimizer"] = False
                elif scheduler is not None and getattr(scheduler, "optimizer", None) is not None:
                    scheduler.optimizer = optimizer  # same groups, now DeepSpeedCPUAdam's
            self.optimizer_name = type(optimizer).__name__
            self.scheduler_name = type(scheduler).__name__ if scheduler is not None else None
            engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer,
                                                   lr_scheduler=scheduler, config=self.config,
                                                   dist_init_required=False)
        self.engine = engine
        self.compiled = ""
        self.model: Any = engine
        self.comm = CommCounter()
        count_deepspeed(self.comm)  # deepspeed.comm's collectives, counted in counted steps

    @staticmethod
    def init_distributed(backend: str) -> None:
        deepspeed = import_deepspeed()
        if not _preloaded:  # a fresh rank (a warm rank's child has its preload's)
            preload_ops(ninja=False)
        deepspeed.init_distributed(dist_backend=backend)

    def micro_step(self, boundary: bool) -> AbstractContextManager[object]:
        return nullcontext()  # the engine knows its accumulation boundaries

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)  # scales by 1 / gradient_accumulation_steps

    def step(self, boundary: bool) -> None:
        self.engine.step()  # at a boundary: clip, optimizer, schedule, zero the gradients

    def counting(self) -> AbstractContextManager[object]:
        return self.comm.step()

    def compile(self) -> None:
        self.engine.compile()  # DeepSpeed's own: torch.compile of the module in the engine
        self.compiled = "engine.compile()"

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def full_params(self, rank: int) -> dict[str, np.ndarray] | None:
        module = self.engine.module
        if self.stage == 3:
            deepspeed = import_deepspeed()

            with deepspeed.zero.GatheredParameters(list(module.parameters()),
                                                   modifier_rank=None):
                return self.step_spec.params_of(module) if rank == 0 else None
        return self.step_spec.params_of(module) if rank == 0 else None

    def describe(self) -> EngineDescription:
        deepspeed = import_deepspeed()

        return {"engine": "deepspeed", "deepspeed": deepspeed.__version__,
                "optimizer": self.optimizer_name, "scheduler": self.scheduler_name,
                "config": self.config,
                "plugin_set": {f"zero_optimization.{k}": v for k, v in self.sized.items()},
                "optimizer_steps": int(self.engine.global_steps),
                "micro_steps": int(self.engine.micro_steps),
                "zero_init": self.zero_init, "compile": self.compiled or False,
                "param_groups": self.groups,
                "compiled_graphs": compiled_graphs() if self.compiled else 0}


def _check(case: Case, step: RankStep) -> None:
    """Refuse, before any launch, what a DeepSpeed case cannot be (with the fix)."""
    if case.zero_stage is None:
        raise ConfigError(f"{case.id}: a deepspeed case needs zero_stage (0, 1, 2 or 3)")
    if case.mesh is not None:
        raise ConfigError(f"{case.id}: deepspeed cases are data parallel over world_size "
                         f"ranks; drop mesh={case.mesh}")
    ds_config(case, resolve_clip(case, step), extra=step.ds_config)  # fail here, not in ranks


#: The deepspeed backend's ranks (its spec's ``ranks``): every case, ``world_size`` 1 too.
RANKS = TorchRanks(DeepSpeedRankEngine, _check)


class DeepSpeedBackend:
    """Trains a :class:`TorchTask` with DeepSpeed in ``case.world_size`` launched ranks."""

    name = "deepspeed"

    def unavailable_reason(self) -> str | None:
        missing = [p for p in ("torch", "deepspeed", "cloudpickle")
                   if importlib.util.find_spec(p) is None]
        if missing:
            return f"the deepspeed backend needs {', '.join(missing)}: {INSTALL}"
        return None

    def train(self, case: Case, task: Task, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        """Train and measure ``case`` in ranks launched on this machine (see
        :mod:`.torch.ranks` for what is measured). With ``case.reference`` the task is also
        trained in this process by plain torch on the full global batch, and its parameters
        are returned for the reference check."""
        return train_in_ranks(RANKS, case, task, accel, timeout=timeout)

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """Two real steps in every rank; the largest rank's peak against the capacity."""
        return RANKS.fits(case, task, accel, timeout=timeout)


BACKEND = DeepSpeedBackend()
