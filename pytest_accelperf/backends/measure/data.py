"""The data a step trains on, as the backends take it: one function of the step number.

Every backend asks for batch ``i`` by calling ``make_batch(i)``, and asks again: the
compile reads batch 0's shapes, the torch backend's counting steps (FLOPs, memory) run
the first batches and are undone, a re-measured run (``--accelperf-confirm``) trains from
step 0 again, the single-device reference trains the first batches twice, A/B mode cycles
through the batches of a run. A ``make_batch(step)`` function answers all of that by
construction. Users' pipelines are iterators instead (a ``torch.utils.data.DataLoader``,
a ``tf.data`` dataset, a generator), so a step may be given ``data=`` in place of
``make_batch``, and :class:`Batches` turns it into that function:

* ``data`` is an **iterable** (a ``DataLoader``, a ``tf.data.Dataset``, a list): each pass
  is ``iter(data)``; or a **function of no arguments** that returns an iterator or an
  iterable (a generator function, ``lambda: iter(dataset)``, a function that builds the
  ``DataLoader``): each pass calls it.
* A one-shot **iterator** (a generator object, ``iter(loader)``, a ``tf.data`` iterator)
  cannot be started again, so it is refused (:func:`batches`), naming what to pass.
* Batch ``i`` is the ``i``-th item of a pass. Asked for batch ``i`` when the current pass
  is past it, a new pass starts (the iterable is iterated again); asked for a later one,
  the pass skips ahead. So a pass is started for each of the repeats above, and reads
  the batches in order.
* Determinism is checked, not assumed: the first batch of every new pass must equal the
  first batch of the first pass (a digest of its leaves' bytes, shapes and dtypes:
  :func:`digest`), else a :class:`TaskError` says so (a ``DataLoader(shuffle=True)`` draws a
  new order on each pass: pass a function that builds it with a seeded ``generator=``).
* A pass that ends before the batch asked for is a one-line :class:`TaskError` naming the
  data, the batch and how many the case needs (:func:`expect`: set by the backend; an
  iterable with a ``len()`` shorter than that is refused before anything runs).

What a pass costs (a ``DataLoader`` starting its workers, a file opened) is paid where it
starts, in the batch of that step: part of the input time the step loop measures
(:mod:`.loop`).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import cast

from pytest_accelperf.backends.measure.common import TaskError, describe
from pytest_accelperf.backends.types import Batch


def _shown(data: object) -> str:
    """How a message names ``data``: a function by name, file and line; anything else by
    its type (``a DataLoader``)."""
    if callable(data) and not hasattr(data, "__iter__"):
        return describe(data)
    return f"(a {type(data).__name__})"


class Batches:
    """``data`` as the ``make_batch(i)`` the backends call (see the module docstring).

    ``owner`` is the field that holds it (``JaxStep.data``): messages name it. Picklable
    (a rank process gets the step by pickle): a pass in progress is not sent, the next
    call starts a new one."""

    def __init__(self, data: object, owner: str) -> None:
        self.data = data
        self.owner = owner
        self.label = f"{owner} {_shown(data)}"
        self._start = _starter(data, self.label)
        #: How many batches the case needs (:func:`expect`), for the message when the data
        #: end early; None until the backend says.
        self.needed: int | None = None
        self._pass: Iterator[Batch] | None = None
        self._next = 0  # the index of the batch the current pass yields next
        self._first: str | None = None  # digest of batch 0 of the first pass

    def __call__(self, i: int) -> Batch:
        if self._pass is None or i < self._next:
            self._pass, self._next = self._start(), 0
        while True:
            index = self._next
            try:
                batch = next(self._pass)
            except StopIteration:
                self._pass = None
                raise TaskError(self._ended(index, i)) from None
            except BaseException:
                self._pass = None  # the user's own error, as make_batch's would be
                raise
            self._next += 1
            if index == 0:
                self._same_first(batch)
            if index == i:
                return batch

    def _ended(self, given: int, asked: int) -> str:
        need = self.needed if self.needed is not None and self.needed > asked else asked + 1
        return (f"{self.label} ran out after {given} batch(es), but the case needs {need} "
                f"(one per step, warm-up included; each re-run starts a new pass): give it "
                f"at least that many, e.g. a longer dataset or a function that returns "
                f"itertools.cycle(...) of it")

    def _same_first(self, batch: Batch) -> None:
        """Refuse a pass whose first batch is not the first pass's first batch."""
        seen = digest(batch)
        if self._first is None:
            self._first = seen
        elif seen != self._first:
            raise TaskError(
                f"{self.label} gave another first batch when iterated again: the plugin "
                f"iterates it once per training it runs (counting steps, re-measurements, "
                f"the reference run), so every pass must give the same batches in the same "
                f"order; a shuffling DataLoader draws a new order on each pass: pass a "
                f"function that builds it with a seeded generator "
                f"(generator=torch.Generator().manual_seed(0)), or seed the shuffle per pass")

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_pass"], state["_next"] = None, 0  # a live iterator does not pickle
        return state


def _starter(data: object, label: str) -> Callable[[], Iterator[Batch]]:
    """A function that starts a new pass over ``data``; a :class:`TaskError` for data that
    cannot be passed over again, or at all."""
    if isinstance(data, Iterator):  # has __next__: iter() of it is itself, half used up
        raise TaskError(
            f"{label} is an iterator, which can be iterated once, and the plugin iterates "
            f"the data once per training it runs (counting steps, re-measurements, the "
            f"reference run): pass the iterable itself (the DataLoader, the dataset), or a "
            f"function of no arguments that makes the iterator (the generator function, "
            f"not its call: data=batches, not data=batches())")
    if hasattr(data, "__iter__"):
        iterable = cast(Iterable[Batch], data)
        return lambda: iter(iterable)
    if not callable(data):
        raise TaskError(f"{label} must be an iterable of batches (a DataLoader, a dataset) or "
                        f"a function of no arguments that returns an iterator of them; got "
                        f"{type(data).__name__}")
    try:
        inspect.signature(data).bind()
    except TypeError:
        raise TaskError(
            f"{label} takes arguments: data is an iterable, or a function of no arguments "
            f"that returns an iterator; a function of the step number is make_batch=") from None
    except ValueError:
        pass  # a builtin without a signature: calling it will tell

    def start() -> Iterator[Batch]:
        made = data()  # what it raises is the user's own error
        try:
            return iter(made)
        except TypeError:
            raise TaskError(f"{label} returns {type(made).__name__}, not an iterator or an "
                            f"iterable of batches") from None

    return start


def batch_function(make_batch: object, data: object, owner: str) -> Callable[[int], Batch]:
    """What a step API keeps as its ``make_batch``: the user's function, or
    :class:`Batches` of ``data``; exactly one of the two must be given (``owner`` is the
    class, ``JaxStep``: messages name its fields)."""
    if data is not None and make_batch is not None:
        if isinstance(make_batch, Batches) and make_batch.data is data:
            return make_batch  # the step made again from its own fields
        raise TaskError(f"{owner} takes make_batch or data, not both: make_batch(step) returns "
                        f"a step's batch, data is an iterable of batches (a DataLoader)")
    if data is not None:
        return Batches(data, f"{owner}.data")
    if make_batch is None:
        raise TaskError(f"{owner} needs its batches: make_batch, a function of the step number "
                        f"that returns its batch, or data, an iterable of batches (a "
                        f"DataLoader) or a function of no arguments that returns an iterator")
    if not callable(make_batch):
        hint = (" (an iterable of batches goes in data=)" if hasattr(make_batch, "__iter__")
                else "")
        raise TaskError(f"{owner}.make_batch must be a function of the step number that "
                        f"returns its batch; got {type(make_batch).__name__}{hint}")
    return make_batch


def source_label(make_batch: object) -> str:
    """How messages name what makes the batches: ``make_batch name (file:line)``, or the
    data (``JaxStep.data (a DataLoader)``)."""
    if isinstance(make_batch, Batches):
        return make_batch.label
    return f"make_batch {describe(make_batch)}"


def expect(make_batch: object, n: int) -> None:
    """Tell data given as an iterable that the case needs ``n`` batches (its message when
    they end early names it); one with a ``len()`` under ``n`` is refused now, before
    anything compiles or trains. Nothing for a ``make_batch`` function."""
    if not isinstance(make_batch, Batches):
        return
    make_batch.needed = n
    data = make_batch.data
    if not isinstance(data, Sized):  # no len(): a generator function
        return
    try:
        length = len(data)
    except Exception:  # no len(): an IterableDataset's loader, a generator function
        return
    if length < n:
        raise TaskError(f"{make_batch.label} holds {length} batch(es), but the case needs {n} "
                        f"(one per step, warm-up included): give it at least that many, e.g. "
                        f"a longer dataset or a function that returns itertools.cycle(...) "
                        f"of it")


def digest(batch: object) -> str:
    """A digest of ``batch``: its containers, and each leaf's bytes, shape and dtype (an
    array: numpy, torch on the CPU, jax, TensorFlow; through ``numpy.asarray``) or its
    ``repr`` (a number, a string). A leaf that is neither (a CUDA tensor, an object) counts
    by its type, shape and dtype only."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, batch, 0)
    return h.hexdigest()


def _feed(h: hashlib.blake2b, value: object, depth: int) -> None:
    import numpy as np

    if depth > 32:
        h.update(b"<deep>")
        return
    if isinstance(value, Mapping):
        h.update(f"{{{type(value).__name__}:{len(value)}".encode())
        for key, item in value.items():
            h.update(repr(key).encode())
            _feed(h, item, depth + 1)
        return
    if isinstance(value, list | tuple):
        h.update(f"[{type(value).__name__}:{len(value)}".encode())
        for item in value:
            _feed(h, item, depth + 1)
        return
    if value is None or isinstance(value, bool | int | float | complex | str | bytes):
        h.update(repr(value).encode())
        return
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None:
        h.update(type(value).__name__.encode())  # an object: its repr may hold its address
        return
    h.update(f"{type(value).__name__}{tuple(shape)}{dtype}".encode())
    try:
        array = np.ascontiguousarray(np.asarray(value))  # at least 1-d
    except Exception:  # a CUDA tensor, bfloat16 in torch: shape and dtype only
        return
    if array.dtype.hasobject:
        h.update(repr(array.tolist()).encode())
    else:
        h.update(array.reshape(-1).view(np.uint8).data)
