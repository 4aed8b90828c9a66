"""Without flax this folder's cases skip, with the install line, instead of failing to
collect (its modules import flax)."""

import pytest

pytest.importorskip("flax", reason="the flax suites need flax: "
                    "pip install 'pytest-accelperf[jax]'")
