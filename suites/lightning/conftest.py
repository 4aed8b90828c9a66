"""Without Lightning this folder's cases skip, with the install line, instead of failing to
collect (its modules import torch and lightning)."""

import pytest

pytest.importorskip("torch", reason="the Lightning suite needs torch and lightning: "
                    "pip install torch==2.13.0 && pip install 'pytest-accelperf[lightning]'")
pytest.importorskip("lightning", reason="the Lightning suite needs lightning: "
                    "pip install torch==2.13.0 && pip install 'pytest-accelperf[lightning]'")
