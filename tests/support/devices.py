"""What the tests expect of the machine they run on: the device a one-process run trains on, the
half-precision dtype mixed precision picks there by default (as Determined and torch.autocast
pick it: float16 on a GPU, bfloat16 on a CPU), and a mark for tests of the CPU's behaviour."""
from __future__ import annotations

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
AUTO_DTYPE = torch.float16 if torch.cuda.is_available() else torch.bfloat16

#: Tests of what the CPU does (bfloat16 by default, float16 overflowing only where a test makes it
#: overflow); on a GPU, float16 is the default and a scale of 2**16 overflows by itself
#: (tests/test_cuda.py and the device-independent tests cover the GPU).
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the CPU's precision behaviour")
