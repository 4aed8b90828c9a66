"""Without torch this folder's cases skip, with the install line, instead of failing to
collect (its modules import torch)."""

import pytest

pytest.importorskip("torch", reason="the torch suites need torch: "
                    "pip install torch==2.13.0 && pip install 'pytest-accelperf[torch]'")
