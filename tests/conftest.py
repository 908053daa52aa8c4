"""Fixtures shared by several test modules."""
import pytest


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
