"""Shared setup for the engine tests (those under streaming/ and server/ too)."""

import pytest
import torch

SEED = 20261130


@pytest.fixture(autouse=True)
def _seeded():
    """Each test draws its random blocks and activations from SEED, not from whatever the tests
    before it left in torch's generator, so a test gives the same data alone, in its file or in the
    whole suite. Why it matters: a float64 reference rounds h (and x) from its own sums, so a value
    within an fp32 step of a rounding boundary flips one int8 quant against the kernel's (an error
    of ~1e-3, above the fp32 bound); a CI run once drew such data (test_int_kernels'
    test_fused_h_quantization..., Q4_K and Q8_0). Fixed data keeps a failure reproducible. (numpy
    draws come from test_kernels.numpy_rng, seeded off torch's generator.)"""
    torch.manual_seed(SEED)
