"""The `gpu` marker with its skip: a test that needs a CUDA device runs where torch sees one
(`pytest -m gpu`; bench/gpu_check.sh on a GPU machine) and is skipped elsewhere, saying why."""

import pytest
import torch

REASON = "needs a CUDA device (torch sees none here); bench/gpu_check.sh runs the gpu tests on a GPU machine"


def needs_cuda(test):
    """Mark `test` as a GPU test, skipped with its reason where CUDA is absent."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason=REASON)(test))
