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


@pytest.fixture(scope="module", params=[0, 16], ids=["plain", "pointer"])
def tiny_student(request, tmp_path_factory):
    """An untrained tiny student (it writes anything), plain and with the pointer head: for the decode loop's
    tests, which compare its outputs along different paths. Its tokenizer knows the mail and invoice tools."""
    from cowork_pipeline.agents.chat_format import render_conversation
    from cowork_pipeline.services import tools_for
    from cowork_pipeline.training.student import StudentConfig, build_student

    tools = tools_for(["mail_search", "mail_read", "crm_update_invoice"])
    corpus = [render_conversation([{"role": "user", "content": "find the invoice INV-1 of Clara and email her"}], tools)] * 4
    cfg = StudentConfig(vocab_size=600, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=2, num_kv_heads=1,
                        max_position_embeddings=2048, min_frequency=1, pointer_dim=request.param)
    return build_student(corpus, tmp_path_factory.mktemp("student"), cfg)
