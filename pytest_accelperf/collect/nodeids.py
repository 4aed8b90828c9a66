"""A pytest plugin that writes what a collection found, for ``accelperf baselines prune``.

``accelperf baselines prune`` runs ``python -m pytest --collect-only -p
pytest_accelperf.collect.nodeids`` with :data:`OUTPUT_ENV` naming a file; this plugin writes
``{"rootdir": ..., "nodeids": [...]}`` there. Every item pytest collected is listed,
including those a ``-k``/``-m`` expression or a plugin deselected afterwards (a case that
pytest collects is never pruned), and node ids are exact: no parsing of the ``-q`` listing,
where a space in a case id or a warning line could be misread.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

#: The environment variable naming the file to write.
OUTPUT_ENV = "ACCELPERF_NODEIDS_FILE"

_SEEN = pytest.StashKey[set[str]]()


def pytest_itemcollected(item: pytest.Item) -> None:
    item.config.stash.setdefault(_SEEN, set()).add(item.nodeid)


def pytest_collection_finish(session: pytest.Session) -> None:
    out = os.environ.get(OUTPUT_ENV)
    if not out:
        return
    seen = session.config.stash.get(_SEEN, set()) | {item.nodeid for item in session.items}
    Path(out).write_text(json.dumps({"rootdir": str(session.config.rootpath),
                                     "nodeids": sorted(seen)}), encoding="utf-8")
