"""``python -m pytest_accelperf.cli ...``: the ``accelperf`` command."""

import sys

from pytest_accelperf.cli import main

sys.exit(main())
