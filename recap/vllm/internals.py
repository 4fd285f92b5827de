"""Every touch of vLLM's internals, in one place: three wraps of the model runner's methods.

vLLM's custom proposers see token ids only; RECAP needs the target's prediction at every position a
pass verified and which request each batch row is. The model runner has both, so `install` wraps
three of its methods (`GPUModelRunner`, which vLLM's CPU runner inherits); for any other drafter the
wraps call the original and do nothing else:

- ``_sample(logits, spec_decode_metadata)``: before sampling, the top-k of each request's logit rows
  (the pending token's, each verified draft's) and the drafts verified go to `RecapProposer.record`;
- ``propose_draft_token_ids(scheduler_output, sampled_token_ids, ...)``: the committed tokens of each
  batch row (``input_batch.token_ids_cpu``, ``num_tokens_no_spec``, ``num_prompt_tokens``, ``req_ids``)
  go to `RecapProposer.draft`, whose chains are the step's drafts;
- ``_update_states(scheduler_output)``: a step starts: its ``total_num_scheduled_tokens`` go to
  `RecapProposer.step` (which times the steps), ``finished_req_ids`` (finished or aborted) to
  `RecapProposer.finish`.

Made for `VLLM_VERSION`; `check` fails loudly (RuntimeError naming what moved) when another version
lacks a method or parameter used here, and `tests/in_vllm/test_internals.py` checks the same.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from typing import Any

import numpy as np
import torch

from recap.vllm.records import RECORD_K, Pass, Recorder, Row

logger = logging.getLogger(__name__)

#: The vLLM release these wraps were written against (`requirements-vllm.txt` pins it).
VLLM_VERSION = "0.32.0"

#: The runner methods wrapped, with the parameters read (in order, after ``self``).
WRAPPED = {
    "_sample": ("logits", "spec_decode_metadata"),
    "propose_draft_token_ids": ("scheduler_output", "sampled_token_ids"),
    "_update_states": ("scheduler_output",),
}
#: Attributes of the runner's input batch read by the wraps.
BATCH_ATTRIBUTES = ("req_ids", "num_reqs", "token_ids_cpu", "num_tokens_no_spec", "num_prompt_tokens")
#: Fields of vLLM's `SpecDecodeMetadata` read by the wraps.
METADATA_FIELDS = ("draft_token_ids", "num_draft_tokens")
#: Fields of vLLM's `SchedulerOutput` read by the wraps.
SCHEDULER_FIELDS = ("total_num_scheduled_tokens", "finished_req_ids")


def runner_class() -> type:
    """vLLM's GPU model runner (the CPU runner inherits from it)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def check() -> None:
    """Raise RuntimeError naming each method, parameter or field the wraps need and this vLLM lacks."""
    import vllm
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    runner, missing = runner_class(), []
    for method, wanted in WRAPPED.items():
        function = getattr(runner, method, None)
        if function is None:
            missing.append(f"GPUModelRunner.{method}")
            continue
        names = list(inspect.signature(function).parameters)[1 : 1 + len(wanted)]
        if tuple(names) != wanted:
            missing.append(f"GPUModelRunner.{method}{tuple(wanted)} (it takes {tuple(names)})")
    for kind, names in ((SpecDecodeMetadata, METADATA_FIELDS), (SchedulerOutput, SCHEDULER_FIELDS)):
        fields = getattr(kind, "__dataclass_fields__", {})
        missing += [f"{kind.__name__}.{name}" for name in names if name not in fields]
    if missing:
        raise RuntimeError(
            f"vLLM {vllm.__version__} moved what RECAP's proposer reads (written for {VLLM_VERSION}): "
            + "; ".join(missing)
        )


def install() -> None:
    """Wrap the runner's methods (once per process; `check` first)."""
    runner = runner_class()
    if getattr(runner, "_recap_wrapped", False):
        return
    check()
    for method in WRAPPED:
        setattr(runner, method, _WRAPS[method](getattr(runner, method)))
    runner._recap_wrapped = True
    logger.info("RECAP: the model runner's %s are wrapped", ", ".join(WRAPPED))


def _recap(runner: Any) -> Recorder | None:
    drafter = getattr(runner, "drafter", None)
    return drafter if isinstance(drafter, Recorder) else None


def _wrap_sample(original):
    @functools.wraps(original)
    def _sample(self, logits, spec_decode_metadata, *args, **kwargs):
        proposer = _recap(self)
        if proposer is not None and logits is not None:
            start = time.thread_time()
            proposer.record(passes(self.input_batch, logits, spec_decode_metadata, proposer.vocab_size))
            proposer.stats.record_seconds += time.thread_time() - start
        return original(self, logits, spec_decode_metadata, *args, **kwargs)

    return _sample


#: CPU seconds (this thread's) the runner spent proposing, whatever the method, and the calls, once
#: `time_proposals` is installed (the vLLM benchmark's clock of every proposer alike).
PROPOSAL_TIME = {"seconds": 0.0, "calls": 0}


def time_proposals() -> None:
    """Time every call of the runner's ``propose_draft_token_ids`` into `PROPOSAL_TIME` (once)."""
    runner = runner_class()
    if getattr(runner, "_recap_timed", False):
        return
    original = runner.propose_draft_token_ids

    @functools.wraps(original)
    def propose_draft_token_ids(self, *args, **kwargs):
        start = time.thread_time()
        try:
            return original(self, *args, **kwargs)
        finally:
            PROPOSAL_TIME["seconds"] += time.thread_time() - start
            PROPOSAL_TIME["calls"] += 1

    runner.propose_draft_token_ids = propose_draft_token_ids
    runner._recap_timed = True


def _wrap_propose(original):
    @functools.wraps(original)
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        proposer = _recap(self)
        if proposer is None:
            return original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        return proposer.draft(rows(self.input_batch, sampled_token_ids, proposer))

    return propose_draft_token_ids


def _wrap_update(original):
    @functools.wraps(original)
    def _update_states(self, scheduler_output, *args, **kwargs):
        proposer = _recap(self)
        if proposer is not None:
            proposer.step(scheduler_output.total_num_scheduled_tokens)
            if scheduler_output.finished_req_ids:
                proposer.finish(scheduler_output.finished_req_ids)
        return original(self, scheduler_output, *args, **kwargs)

    return _update_states


_WRAPS = {"_sample": _wrap_sample, "propose_draft_token_ids": _wrap_propose, "_update_states": _wrap_update}


def passes(batch: Any, logits: torch.Tensor, metadata: Any, vocab_size: int) -> list[Pass]:
    """Each request's verified pass: its logit rows are consecutive, the pending token's then one per
    draft (``metadata.num_draft_tokens``; one row a request without metadata). A batch whose rows do
    not add up (a warm-up run) gives nothing."""
    req_ids = list(batch.req_ids[: batch.num_reqs])
    if metadata is None:
        counts = [0] * len(req_ids)
        drafts = np.zeros(0, dtype=np.int64)
    else:
        counts = [int(n) for n in metadata.num_draft_tokens]
        drafts = metadata.draft_token_ids.cpu().numpy().astype(np.int64)
    if len(counts) != len(req_ids) or sum(counts) + len(counts) != len(logits):
        return []
    probs, ids = torch.softmax(logits[:, :vocab_size].float(), dim=-1).topk(RECORD_K, dim=-1)
    ids, probs = ids.cpu().numpy(), probs.cpu().numpy()
    found, row, drafted = [], 0, 0
    for req_id, count in zip(req_ids, counts):
        chain = tuple(int(t) for t in drafts[drafted : drafted + count])
        found.append(Pass(req_id, chain, ids[row : row + count + 1], probs[row : row + count + 1]))
        row, drafted = row + count + 1, drafted + count
    return found


def rows(batch: Any, sampled_token_ids: list[list[int]], proposer: Recorder) -> list[Row]:
    """Each batch row's committed tokens, what it sampled this step and the drafts it has room for."""
    found = []
    for index, sampled in enumerate(sampled_token_ids):
        length = int(batch.num_tokens_no_spec[index])
        room = min(proposer.k, proposer.max_model_len - length - 1)
        context = batch.token_ids_cpu[index, :length]
        found.append(Row(batch.req_ids[index], context, sampled, int(batch.num_prompt_tokens[index]), room))
    return found
