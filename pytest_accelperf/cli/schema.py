"""``accelperf schema baseline|report|history``: the JSON Schema of a baseline block, a JSON
report or a history line (:mod:`pytest_accelperf.store.schema`)."""

from __future__ import annotations

import argparse
import json
from typing import Literal, TextIO, cast

from pytest_accelperf.store.schema import json_schema


def cmd_schema(args: argparse.Namespace, out: TextIO) -> int:
    kind = cast(Literal["baseline", "report", "history"], args.kind)
    out.write(json.dumps(json_schema(kind), indent=2, sort_keys=True) + "\n")
    return 0
