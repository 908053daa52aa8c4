"""Fixtures shared by several test modules, and the property tests' Hypothesis profile."""
import os

import pytest
from hypothesis import settings

# A red run must come from the change under test: by default every property test draws the same examples on every
# run (derandomize) and keeps no example database. HYPOTHESIS_PROFILE=explore draws new examples each run (and
# replays the ones that failed before, from .hypothesis/) to hunt for bugs; pin what it finds as an explicit case.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(scope="module")
def one_torch_thread():
    # Tiny models gain nothing from intra-op threads, while on a shared, oversubscribed CI box OpenMP
    # spin-waiting makes them many times slower. Restored afterwards for other test modules.
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def sb():
    """A one-worker checker sandbox for the module."""
    from cowork_pipeline.validation.sandbox import Sandbox

    with Sandbox(workers=1) as box:
        yield box


@pytest.fixture(scope="module")
def validator(sb):
    from cowork_pipeline.validation.certify import Validator

    return Validator(sb)
