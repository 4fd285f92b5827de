"""The one module that touches vLLM's internals (`recap.vllm.internals`) fits the installed vLLM, and
says what moved when it does not."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


def test_the_installed_vllm_has_what_the_wraps_read():
    import vllm

    from recap.vllm import internals

    assert vllm.__version__ == internals.VLLM_VERSION
    internals.check()  # raises, naming what moved, otherwise
    from vllm.v1.worker.gpu_input_batch import InputBatch

    assert {"req_ids", "num_reqs"} <= set(vars(InputBatch))  # properties; the rest are set in __init__


def test_a_moved_method_is_named_in_a_loud_error(monkeypatch):
    from recap.vllm import internals

    class Moved:
        def _sample(self, logits, metadata):  # a renamed parameter
            pass

        def _update_states(self, scheduler_output):
            pass

    monkeypatch.setattr(internals, "runner_class", lambda: Moved)
    with pytest.raises(RuntimeError) as error:
        internals.check()
    message = str(error.value)
    assert "GPUModelRunner._sample('logits', 'spec_decode_metadata')" in message
    assert "GPUModelRunner.propose_draft_token_ids" in message and "0.32.0" in message
