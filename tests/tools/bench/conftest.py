import pytest
import torch

from tests.conftest import tiny_llama


@pytest.fixture(scope="module")
def tiny_pair():
    # the draft is the target with small noise on its output layer: it agrees often, not always
    target, draft = tiny_llama(seed=0), tiny_llama(seed=0)
    with torch.no_grad():
        draft.model.lm_head.weight.add_(torch.randn_like(draft.model.lm_head.weight) * 0.3)
    return target, draft
