"""Without transformers this folder's cases skip, with the install line, instead of failing
to collect (its modules import torch and transformers)."""

import pytest

_INSTALL = "pip install torch==2.13.0 && pip install 'pytest-accelperf[hf]'"
pytest.importorskip("torch", reason=f"the Hugging Face suite needs torch: {_INSTALL}")
pytest.importorskip("transformers", reason=f"the Hugging Face suite needs transformers: "
                    f"{_INSTALL}")
pytest.importorskip("accelerate", reason=f"the Hugging Face suite needs accelerate: {_INSTALL}")
