"""Names for the values of Ray's dynamic API that this package holds and passes on.

Ray builds its actor handles and object references at run time (``ActorClass.remote()``,
``handle.method.remote()``): their methods are not known to a type checker, so they are
typed as open values here, under names that say what each one is. The ``ray`` module
itself is imported lazily and typed as a module (:func:`.connection.import_ray`).
"""

from __future__ import annotations

from typing import Any, TypeAlias

#: A Ray actor handle (a :class:`~.worker.CaseWorker` or :class:`~.worker.ProgressBoard` on
#: the cluster): its methods are called through ``.remote(...)``.
ActorHandle: TypeAlias = Any
#: A Ray object reference (what ``.remote(...)`` returns; ``ray.get`` reads it).
ObjectRef: TypeAlias = Any
#: A Ray placement group (``ray.util.placement_group``).
PlacementGroup: TypeAlias = Any
