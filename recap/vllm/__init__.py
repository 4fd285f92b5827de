"""RECAP inside vLLM: a speculative proposer that recycles the target's own predictions.

    LLM(model, speculative_config={"method": "custom_class", "model": "recap.vllm.RecapProposer",
                                   "num_speculative_tokens": 4})

`recap.vllm.proposer` holds the method's side (one `RecapDrafter` per running request on one
persistent memory; no vLLM import); `recap.vllm.internals` is the only module of `recap/` that touches
vLLM, wrapping three model-runner methods so that the proposer sees the logits of every verified
position and the requests' ids. docs/vllm.md: setup, serving, what differs from this project's engine.
"""

from recap.vllm.proposer import RecapProposer

__all__ = ["RecapProposer"]
