"""Without jax this folder's cases skip, with the install line, instead of failing to
collect (its modules import jax)."""

import pytest

pytest.importorskip("jax", reason="the jax suites need jax: "
                    "pip install 'pytest-accelperf[jax]'")
