"""Names for the open framework values the backends pass around.

A backend handles values whose type is the user's or the framework's to choose: a JAX
state is any pytree, a batch whatever the user's ``make_batch`` returns, a training step's
output whatever the user's function returns until the backend has checked it. These have
no narrower type that mypy could check (jax's own typing has a pytree as ``Any``), so they
are ``Any``, under names that say what they hold; everything the backends can type more
precisely (``torch.Tensor``, ``torch.nn.Module``, ``jax.Array``, ``object`` for a value
only passed on) is typed so.

Importing this module imports no framework.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, TypeAlias

#: Any nesting of containers (dicts, lists, tuples, ``None``, dataclasses and other
#: registered nodes) with arrays at the leaves, as jax's own typing has it
#: (``jax.tree_util`` takes and returns ``Any``): a JAX step's state, its parameters, a
#: spec tree, a tree of shardings, abstract values (``ShapeDtypeStruct``) or tracers.
PyTree: TypeAlias = Any

#: A leaf of a pytree or of a batch: a jax, numpy or torch array, a Python number, or any
#: other object not taken apart as a container (a string in a state dict).
Leaf: TypeAlias = Any

#: One batch as the user's ``make_batch(step)`` or ``data`` gives it: whatever the user's
#: step takes (a pytree of numpy or jax arrays, a torch tensor, a dict or tuple of
#: tensors, a model's own input object).
Batch: TypeAlias = Any

#: What a user's function returned, before the backend has checked it: a loss (a jax
#: scalar or tracer, a torch tensor, a Python number), ``(loss, aux)``, ``(state,
#: metrics)``, a metrics dict, or anything else the backend then refuses with a
#: :class:`~pytest_accelperf.backends.measure.common.TaskError` naming the function.
UserValue: TypeAlias = Any

#: A value of a framework that ships no types the backends can use (DeepSpeed's engine,
#: Alpa's parallel method, an XLA cost analysis, a torch op overload or dispatch
#: argument as ``__torch_dispatch__`` receives it): read only through the attributes that
#: framework documents.
Untyped: TypeAlias = Any

#: A framework imported when a backend runs rather than at import time (``jax``,
#: ``optax``, ``flax.nnx``, ``deepspeed``, ``alpa``): its attributes are ``Any`` to mypy.
Framework: TypeAlias = ModuleType

#: Keyword arguments forwarded to a framework's own callable as the user gave them, with
#: what the gate owns set in them: ``lightning.Trainer(**kwargs)``, Keras's
#: ``model.fit(**kwargs)``, transformers' ``Trainer(**kwargs)``, DeepSpeed's config. Their
#: values are the framework's to type.
FrameworkKwargs: TypeAlias = dict[str, Any]
