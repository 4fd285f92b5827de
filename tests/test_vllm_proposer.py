"""`recap.vllm.proposer.RecapProposer` without vLLM: its CPU twin drives it the way vLLM's runner does
(one pass a step for several requests at once, the runner's `Pass` and `Row` values, finished requests
told), with this project's engine computing the passes of the embedded vision model. The same code runs
inside vLLM in `tests/in_vllm/`."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from recap.decode import generate
from recap.memory.fingerprint import memory_tag, model_fingerprint, tokenizer_fingerprint
from recap.memory.persistent import PersistentMemory
from recap.models.families import placeholder_ids
from recap.tree import DraftTree
from recap.verify import accept_greedy
from recap.vllm.proposer import EXPLORE, RecapProposer
from recap.vllm.records import RECORD_K, Pass, Row

EMBEDDED = "assets/models/tiny-scenes-llava-v2"
K = 4


def vllm_config(target, max_model_len: int = 1024, k: int = K) -> SimpleNamespace:
    """What the proposer reads of vLLM's config, for the embedded model."""
    model = SimpleNamespace(
        max_model_len=max_model_len, hf_config=target.model.config, model=target.name, tokenizer=None,
        get_vocab_size=lambda: target.vocab_size,
    )  # fmt: skip
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k), model_config=model)


def topk(logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    probs, ids = torch.softmax(logits.float(), -1).topk(RECORD_K, -1)
    return ids.numpy(), probs.numpy()


class Request:
    """One request as the twin's runner keeps it: its cache, committed tokens and drafts to verify."""

    def __init__(self, req_id, target, prompt, image, max_tokens):
        self.req_id, self.max_tokens = req_id, max_tokens
        inputs = target.prepare([image], prompt)
        self.tokens = inputs["input_ids"][0].tolist()
        self.prompt_length = len(self.tokens)
        self.state, logits = target.prefill(inputs, [self.prompt_length - 1])
        self.first = logits[-1]
        self.drafts: list[int] = []
        self.generated: list[int] = []


def run_twin(proposer, target, requests, max_model_len=1024) -> dict[str, list[int]]:
    """Step every unfinished request once a step (a prefill, or one pass over its pending token and
    drafts), as vLLM's runner does: `record` the passes, commit, then `draft` for every row."""
    running = list(requests)
    while running:
        passes, sampled = [], {}
        for request in running:
            if not request.generated and len(request.tokens) == request.prompt_length:  # its prefill
                ids, probs = topk(request.first[None])
                passes.append(Pass(request.req_id, (), ids, probs))
                sampled[request.req_id] = [int(request.first.argmax())]
                continue
            tree = DraftTree(request.drafts, list(range(-1, len(request.drafts) - 1)))
            logits = target.forward_tree(request.state, [request.tokens[-1]], tree)
            ids, probs = topk(logits)
            passes.append(Pass(request.req_id, tuple(request.drafts), ids, probs))
            acceptance = accept_greedy(tree, logits.argmax(-1).tolist())
            target.commit(request.state, len(tree), acceptance.nodes)
            sampled[request.req_id] = list(acceptance.tokens)
        proposer.record(passes)
        rows, finished = [], []
        for request in running:
            new = sampled[request.req_id][: request.max_tokens - len(request.generated)]
            ends = [i for i, token in enumerate(new) if token in target.eos_ids]
            new = new[: ends[0] + 1] if ends else new  # (the end of text is committed, then it stops)
            request.tokens += new
            request.generated += new
            room = min(K, max_model_len - len(request.tokens) - 1)
            rows.append(Row(request.req_id, np.array(request.tokens), new, request.prompt_length, room))
            if len(request.generated) >= request.max_tokens or ends:
                finished.append(request)
        drafts = proposer.draft(rows)
        for request, chain in zip(running, drafts, strict=True):
            assert len(chain) <= K
            request.drafts = chain
        proposer.finish([r.req_id for r in finished])  # what the runner learns at its next step
        running = [r for r in running if r not in finished]
    return {r.req_id: r.generated for r in requests}


@pytest.fixture(scope="module")
def runtime():
    from recap.runtime import Runtime

    return Runtime.load(EMBEDDED)


def test_the_twin_runner_is_lossless_with_requests_at_once_and_frees_finished_ones(runtime):
    target = runtime.target
    proposer = RecapProposer(vllm_config(target), install_hooks=False)
    assert proposer.excluded == target.excluded_ids & placeholder_ids(target.model.config)
    questions = ["Describe this scene.", "How many shapes are there?", "Describe this scene."]
    images = [Image.open(f"assets/examples-v2/scene_{i}.png") for i in (1, 2, 3)]
    lengths = [40, 12, 30]
    for round_ in range(2):  # the second round drafts from what the first recycled
        requests = [
            Request(f"r{round_}-{i}", target, q, image, n)
            for i, (q, image, n) in enumerate(zip(questions, images, lengths))
        ]
        outputs = run_twin(proposer, target, requests)
        for request, question, image, n in zip(requests, questions, images, lengths):
            expected = generate(target, runtime.drafter("ar"), question, [image], n).tokens
            assert outputs[request.req_id] == expected[:n]
        assert proposer.requests == {}  # finished requests are gone
    assert proposer.stats.accepted > 0.2 * proposer.stats.passes  # its chains were accepted
    assert len(proposer.stream.suffix_history) > 0  # the finished answers joined the stream


def test_a_batch_wide_cut_on_a_steep_pass_cost_sends_fewer_drafts_and_stays_lossless(runtime):
    target = runtime.target
    questions = ["Describe this scene.", "How many shapes are there?", "What is in the picture?"]
    images = [Image.open(f"assets/examples-v2/scene_{i}.png") for i in (1, 2, 3)]
    sent = {}
    for steep in (False, True):
        proposer = RecapProposer(vllm_config(target), install_hooks=False)
        if steep:  # a fit where a draft costs a fifth of a pass's fixed part
            for tokens in [4, 8, 12, 16] * 8:
                proposer.pass_cost.add(tokens, tokens - 3, 0.05 + 0.01 * tokens)
            assert proposer.pass_cost.fit() == pytest.approx((0.05, 0.0, 0.01))
        for round_ in range(2):
            requests = [Request(f"r{round_}-{i}", target, q, image, 24) for i, (q, image) in
                        enumerate(zip(questions, images))]  # fmt: skip
            outputs = run_twin(proposer, target, requests)
            for request, question, image in zip(requests, questions, images):
                expected = generate(target, runtime.drafter("ar"), question, [image], 24).tokens
                assert outputs[request.req_id] == expected[:24]
        sent[steep] = proposer.stats.proposed
        assert proposer.stats.accepted > 0
    assert 0 < sent[True] < sent[False]


def test_the_step_clock_times_the_verification_steps_the_proposer_planned(runtime, monkeypatch):
    proposer = RecapProposer(vllm_config(runtime.target), install_hooks=False)
    clock = iter([10.0, 10.5, 10.6, 10.7])
    monkeypatch.setattr("recap.vllm.proposer.time.perf_counter", lambda: next(clock))
    seen = []
    monkeypatch.setattr(proposer.pass_cost, "add", lambda *step: seen.append(step))
    proposer._planned = (8, 6)  # (what `draft` sets: the rows' pending tokens and drafts, the drafts)
    for tokens in (8, 40, 8, 8):  # the second step also computes a prefill: not timed
        proposer.step(tokens)
    assert seen == [(8, 6, 0.5), (8, 6, pytest.approx(0.1))]


def test_with_a_costly_speculative_path_a_batch_sends_no_drafts_and_explores_while_it_cannot_tell(runtime):
    target = runtime.target
    proposer = RecapProposer(vllm_config(target), install_hooks=False)
    for tokens in [4, 8, 12, 16] * 8:  # drafting costs a step as much as 40 tokens: nothing pays for it
        proposer.pass_cost.add(tokens, tokens - 3, 0.05 + 0.4 + 0.001 * tokens)
        proposer.pass_cost.add(3, 0, 0.05 + 0.001 * 3)
    assert proposer.pass_cost.fit() == pytest.approx((0.05, 0.4, 0.001))
    questions = ["Describe this scene.", "How many shapes are there?"]
    images = [Image.open(f"assets/examples-v2/scene_{i}.png") for i in (1, 2)]
    requests = [Request(f"r{i}", target, q, image, 16) for i, (q, image) in enumerate(zip(questions, images))]
    outputs = run_twin(proposer, target, requests)
    for request, question, image in zip(requests, questions, images):
        expected = generate(target, runtime.drafter("ar"), question, [image], 16).tokens
        assert outputs[request.req_id] == expected
    assert proposer.stats.proposed == 0
    fresh = RecapProposer(vllm_config(target), install_hooks=False)
    for tokens in [4, 8, 12, 16] * 8:  # only steps with drafts seen: what drafting costs is unknown
        fresh.pass_cost.add(tokens, tokens - 3, 0.05 + 0.001 * tokens)
    fresh._since_plain = EXPLORE - 1
    sent, draft = [], fresh.draft
    fresh.draft = lambda rows: sent.append(draft(rows)) or sent[-1]
    run_twin(fresh, target, [Request("x", target, questions[0], images[0], 24)])
    assert sent[0] == [[]] and any(chain for (chain,) in sent[1:])  # one step explores, then drafts


def test_rows_without_tokens_get_no_drafts_and_the_length_limit_cuts_chains(runtime):
    target = runtime.target
    proposer = RecapProposer(vllm_config(target), install_hooks=False)
    image = Image.open("assets/examples-v2/scene_1.png")
    first = Request("a", target, "Describe this scene.", image, 30)
    run_twin(proposer, target, [first])
    context = np.array(first.tokens[:-5])
    rows = [
        Row("partial", context, [], first.prompt_length, K),  # a prefill still in progress
        Row("near-limit", context, [int(context[-1])], first.prompt_length, 1),
        Row("at-limit", context, [int(context[-1])], first.prompt_length, 0),
    ]
    drafts = proposer.draft(rows)
    assert drafts[0] == [] and len(drafts[1]) <= 1 and drafts[2] == []
    assert "partial" not in proposer.requests  # nothing begun for it yet
    proposer.finish(["near-limit", "at-limit", "never-seen"])
    assert proposer.requests == {}


def test_a_pass_that_does_not_fit_its_row_is_not_recycled(runtime, caplog):
    target = runtime.target
    proposer = RecapProposer(vllm_config(target), install_hooks=False)
    context = np.array([1, 2, 3, 4, 5])
    proposer.draft([Row("x", context, [5], 4, K)])
    ids = np.zeros((1, RECORD_K), dtype=np.int64)
    proposer.record([Pass("x", (7, 8), ids, np.zeros((1, RECORD_K), np.float32))])  # 1 row, 2 drafts
    proposer.draft([Row("x", np.array([1, 2, 3, 4, 5, 6]), [6], 4, K)])
    assert "not recycled" in caplog.text and proposer.stats.passes == 0


def test_the_persistent_memory_starts_from_a_saved_file_made_for_the_model(runtime, tmp_path, monkeypatch):
    target = runtime.target
    tag = memory_tag(target.name, tokenizer_fingerprint(target.model_type, target.vocab_size,
                                                           target.tokenizer.get_vocab()))  # fmt: skip
    assert tag == model_fingerprint(target)  # the tag this project's engine gives the same model
    saved = PersistentMemory(target.vocab_size, RECORD_K)
    saved.write_many(np.array([5]), np.array([[6] * RECORD_K]), np.array([[0.9] + [0.0] * (RECORD_K - 1)]))
    path = tmp_path / "memory.safetensors"
    saved.save(path, tag)
    monkeypatch.setenv("RECAP_VLLM_MEMORY", str(path))
    proposer = RecapProposer(vllm_config(target), install_hooks=False)
    assert len(proposer.persistent) == 1 and proposer.persistent.lookup(5).ids[0] == 6
    saved.save(path, "another model")
    with pytest.raises(ValueError, match="fingerprint"):
        RecapProposer(vllm_config(target), install_hooks=False)
    monkeypatch.delenv("RECAP_VLLM_MEMORY")
    for name, value in (("RECAP_VLLM_CONTEXT_SCOPE", "everywhere"), ("RECAP_VLLM_BUDGET", "lots"),
                        ("RECAP_VLLM_BUDGET", "0"), ("RECAP_VLLM_DRAFT_COST", "nan"),
                        ("RECAP_VLLM_DRAFT_COST", "sometimes")):  # fmt: skip
        with monkeypatch.context() as patch:
            patch.setenv(name, value)
            with pytest.raises(ValueError, match=name):
                RecapProposer(vllm_config(target), install_hooks=False)


def test_the_runner_hooks_split_logit_rows_by_request_and_read_each_rows_tokens():
    """`recap.vllm.internals.passes` and `rows` on what vLLM's runner holds (stand-ins of its batch and
    spec-decode metadata: the fields the wraps read)."""
    from recap.vllm.internals import passes, rows

    batch = SimpleNamespace(
        req_ids=["a", "b", "c"], num_reqs=3, num_prompt_tokens=np.array([2, 3, 2]),
        num_tokens_no_spec=np.array([4, 3, 9]), token_ids_cpu=np.arange(30).reshape(3, 10),
    )  # fmt: skip
    metadata = SimpleNamespace(draft_token_ids=torch.tensor([7, 8, 9]), num_draft_tokens=[2, 0, 1])
    logits = torch.zeros(6, 12)
    logits[torch.arange(6), torch.tensor([1, 2, 3, 4, 5, 6])] = 10.0  # row r predicts token r + 1
    found = passes(batch, logits, metadata, vocab_size=10)
    assert [(p.req_id, p.drafts, p.topk_ids[:, 0].tolist()) for p in found] == [
        ("a", (7, 8), [1, 2, 3]), ("b", (), [4]), ("c", (9,), [5, 6]),
    ]  # fmt: skip
    assert all(p.topk_ids.shape[1] == RECORD_K and (p.topk_ids < 10).all() for p in found)  # inside the vocab
    assert passes(batch, logits[:5], metadata, 10) == []  # rows that do not add up: a warm-up run
    plain = passes(batch, logits[:3], None, 10)  # no drafts this step: one row a request
    assert [p.drafts for p in plain] == [(), (), ()]
    proposer = SimpleNamespace(k=4, max_model_len=11)
    found = rows(batch, [[3], [], [8]], proposer)
    assert [(r.req_id, r.context.tolist(), list(r.sampled), r.prompt_length, r.room) for r in found] == [
        ("a", [0, 1, 2, 3], [3], 2, 4), ("b", [10, 11, 12], [], 3, 4), ("c", list(range(20, 29)), [8], 2, 1),
    ]  # fmt: skip
