"""SuffixDecoding (`suffix`) through its authors' package: tree conversion, request life cycle, the
global tree across requests, settings, the missing-package message, and lossless decoding on real
(tiny) models. ``tests/test_lossless.py`` also runs `suffix` on every architecture (it is in METHODS).
"""

from __future__ import annotations

import ast
import copy
import gc
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from conftest import noise_image, reference_greedy, tiny
from tiny_models import ARCHITECTURES

from recap import bench
from recap.decode import generate, generate_steps
from recap.drafters import make_drafter
from recap.drafters.base import Observation, RequestInfo
from recap.drafters.suffix_decoding import (
    INSTALL_COMMAND,
    SOURCE,
    SuffixConfig,
    SuffixDecodingDrafter,
    SuffixTreeCache,
    draft_tree,
)
from recap.runtime import Runtime
from recap.state import DrafterState
from recap.tree import DraftTree
from recap.verify import accept_greedy, truncate

VOCAB = 64
IMAGE = 63  # the image placeholder id of every fake request
EOS = 62


# ------------------------------------------------------------------------------- a fake request loop
def oracle(tree: DraftTree, answer: Sequence[int], done: int) -> list[int]:
    """The greedy tokens a target whose output is ``answer`` gives at the root and every node
    (``done`` answer tokens committed); off-answer paths get token 0."""
    greedy = [answer[done] if done < len(answer) else 0]
    for node in range(len(tree)):
        path = tree.path(node)
        on_answer = list(answer[done : done + len(path)]) == path and done + len(path) < len(answer)
        greedy.append(answer[done + len(path)] if on_answer else 0)
    return greedy


def serve(drafter: SuffixDecodingDrafter, prompt: Sequence[int], answer: Sequence[int], stop_after=None):
    """One request whose greedy answer is ``answer``: propose, verify, observe, as `recap.decode` does.

    Returns the trees drafted (one per decoding pass). ``stop_after``: abandon after that many passes.
    """
    drafter.begin(RequestInfo(tuple(prompt), frozenset({IMAGE}), VOCAB, frozenset({EOS})))
    drafter.observe(Observation(list(prompt), np.arange(0)))  # the prefill pass
    context, done, trees = [*prompt, answer[0]], 1, []
    while done < len(answer) and (stop_after is None or len(trees) < stop_after):
        tree = drafter.propose(context)
        tree.validate()
        trees.append(tree)
        acceptance = accept_greedy(tree, oracle(tree, answer, done))
        acceptance, _ = truncate(acceptance, {EOS}, len(answer) - done)
        positions = np.arange(len(context) - 1, len(context))
        drafter.observe(Observation(list(context), positions, tree, acceptance=acceptance))
        context += acceptance.tokens
        done += len(acceptance.tokens)
    assert stop_after is not None or context == [*prompt, *answer]  # verification keeps it exact
    return trees


# ------------------------------------------------------------------------------ draft -> DraftTree
@pytest.mark.parametrize(
    ("token_ids", "parents", "probs", "tokens", "tree_parents"),
    [
        # the authors' example shape: root -> [4 -> [5], 6], mapped one to one
        ([4, 6, 5], [-1, -1, 0], [0.5, 0.5, 0.5], [4, 6, 5], [-1, -1, 0]),
        ([], [], [], [], []),  # nothing matched: the empty tree
        # an image placeholder is never drafted: dropped with its subtree
        ([4, IMAGE, 5, 7], [-1, -1, 1, 0], [1.0, 0.5, 0.5, 1.0], [4, 7], [-1, 0]),
        # ids outside the vocabulary are dropped too
        ([VOCAB, 3, -1], [-1, -1, 1], [1.0, 1.0, 1.0], [3], [-1]),
        # a parent that comes after its child is not a tree: dropped
        ([4, 5, 6], [-1, 2, 0], [1.0, 1.0, 1.0], [4, 6], [-1, 0]),
    ],
)
def test_draft_tree(token_ids, parents, probs, tokens, tree_parents):
    tree = draft_tree(token_ids, parents, probs, VOCAB, {IMAGE})
    tree.validate()
    assert (tree.tokens, tree.parents) == (tokens, tree_parents)
    assert all(sources == (SOURCE,) for sources in tree.sources)


def test_draft_tree_scores_and_root_candidates_are_the_estimated_probabilities():
    tree = draft_tree([4, 6, 5], [-1, -1, 0], [0.75, 0.25, 0.5], VOCAB)
    assert tree.scores == [0.75, 0.25, 0.5]
    assert [(c.token, c.prob, dict(c.contributions)) for c in tree.root_candidates] == [
        (4, 0.75, {SOURCE: 0.75}),
        (6, 0.25, {SOURCE: 0.25}),
    ]


# ---------------------------------------------------------------------------------------- settings
def _authors_vllm_defaults() -> dict[str, object]:
    """Field defaults of ``ArcticSpeculativeConfig`` and the fallback of ``num_speculative_tokens`` for
    the suffix method, read from the installed package's source (importing it would need vLLM)."""
    spec = importlib.util.find_spec("arctic_inference")
    source = Path(next(iter(spec.submodule_search_locations))) / "vllm" / "config.py"
    module = ast.parse(source.read_text())
    classes = {n.name: n for n in module.body if isinstance(n, ast.ClassDef)}
    config = classes["ArcticSpeculativeConfig"]
    defaults = {
        n.target.id: ast.literal_eval(n.value)
        for n in config.body
        if isinstance(n, ast.AnnAssign) and n.value is not None and isinstance(n.value, ast.Constant)
    }
    patch = classes["SpeculativeConfigPatch"]
    fallbacks = [
        n.value.value
        for n in ast.walk(patch)
        if isinstance(n, ast.Assign)
        and ast.unparse(n.targets[0]) == "self.num_speculative_tokens"
        and isinstance(n.value, ast.Constant)
    ]
    defaults["num_speculative_tokens"] = fallbacks[0]
    return defaults


def test_defaults_are_the_authors_vllm_defaults():
    authors = _authors_vllm_defaults()
    ours = SuffixConfig()
    assert ours.max_spec_tokens == authors["num_speculative_tokens"] == 16
    assert ours.max_spec_factor == authors["suffix_max_spec_factor"]
    assert ours.max_spec_offset == authors["suffix_max_spec_offset"]
    assert ours.min_token_prob == authors["suffix_min_token_prob"]
    assert ours.max_tree_depth == authors["suffix_cache_max_depth"]
    assert ours.max_cached_requests == authors["suffix_cache_max_requests"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_spec_tokens": 0}, "max_spec_tokens must be from 1"),
        ({"max_spec_tokens": 2.5}, "whole number"),
        ({"max_spec_tokens": True}, "whole number"),
        ({"min_token_prob": 1.5}, "min_token_prob"),
        ({"max_spec_factor": -1.0}, "max_spec_factor"),
        ({"max_tree_depth": 0}, "max_tree_depth"),
        ({"max_cached_requests": 0}, "max_cached_requests"),
    ],
)
def test_config_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        SuffixConfig(**overrides)


def test_max_spec_tokens_caps_the_tree():
    answer = list(range(10, 50))
    for size in (1, 4, 8):
        drafter = SuffixDecodingDrafter(config=SuffixConfig(max_spec_tokens=size))
        serve(drafter, [1, 2, 3], answer)  # fills the global tree
        trees = serve(drafter, [4, 5, 6], answer)
        assert max(len(t) for t in trees) == size


# ---------------------------------------------------------------------------- drafting from the trees
def test_copies_from_the_prompt_and_never_sees_image_placeholders():
    prompt = [IMAGE, IMAGE, IMAGE, 5, 6, 7, 8, 9, 10, 11, 12, 3]
    answer = [5, 6, 7, 8, 9, 10, 11, 12, 2]
    drafter = SuffixDecodingDrafter()
    trees = serve(drafter, prompt, answer)
    assert all(IMAGE not in t.tokens for t in trees)
    assert {s for t in trees for s in t.sources} == {(SOURCE,)}
    assert drafter._text == [5, 6, 7, 8, 9, 10, 11, 12, 3, *answer]  # what its trees hold
    # a match of m tokens drafts at most m (max_spec_factor 1): 1, then 3, then 7 tokens
    assert [t.tokens for t in trees] == [[6], [8, 9, 10], [12, 3, 5, 6, 7, 8, 9]]


def test_earlier_responses_are_drafted_for_a_new_request():
    answer = list(range(20, 36))  # 16 distinct tokens that no prompt contains
    drafter = SuffixDecodingDrafter()
    first = serve(drafter, [1, 2], answer)
    assert len(first) == len(answer) - 1 and not any(len(t) for t in first)  # nothing to copy yet
    second = serve(drafter, [3, 4], answer)
    assert len(second) <= 5 and second[0].tokens == [21]  # the global tree knows the first answer
    assert drafter.cache.cached_requests == 2


def test_drafters_sharing_a_cache_have_their_own_requests():
    cache = SuffixTreeCache()
    a, b = SuffixDecodingDrafter(cache), SuffixDecodingDrafter(cache)
    serve(a, [1, 2], [20, 21, 22, 23], stop_after=1)
    serve(b, [3, 4], [30, 31, 32, 33], stop_after=1)
    assert a.request_id != b.request_id and cache.active_requests == 2
    # b's open request learns from a's committed tokens through the global tree
    assert b.propose([3, 4, 30, 31, 20]).tokens[:1] == [21]


# ------------------------------------------------------------------------------ request life cycle
def test_eos_stops_the_request_and_keeps_its_response():
    cache = SuffixTreeCache()
    drafter = SuffixDecodingDrafter(cache)
    serve(drafter, [1, 2], [20, 21, 22, EOS])
    assert (cache.active_requests, cache.cached_requests, drafter.request_id) == (0, 1, None)
    assert len(drafter.propose([1, 2, 20, 21, 22, EOS])) == 0  # stopped: drafts nothing, no error


def test_an_abandoned_request_is_stopped_at_the_next_begin_or_when_the_drafter_goes():
    cache = SuffixTreeCache()
    drafter = SuffixDecodingDrafter(cache)
    serve(drafter, [1, 2], [20, 21, 22, 23, 24], stop_after=1)  # a cancelled stream
    abandoned = drafter.request_id
    assert cache.active_requests == 1
    serve(drafter, [3, 4], [20, 21, 22, 23, 24], stop_after=1)
    assert cache.active_requests == 1 and drafter.request_id != abandoned
    del drafter
    gc.collect()
    assert cache.active_requests == 0 and cache.cached_requests == 2


def test_close_is_idempotent_and_propose_before_begin_is_an_error():
    drafter = SuffixDecodingDrafter()
    with pytest.raises(RuntimeError, match="begin"):
        drafter.propose([1, 2])
    serve(drafter, [1, 2], [20, 21, 22], stop_after=1)
    drafter.close()
    drafter.close()
    assert drafter.cache.active_requests == 0


def test_reset_forgets_the_global_tree_and_requests_in_flight():
    cache = SuffixTreeCache()
    drafter = SuffixDecodingDrafter(cache)
    answer = list(range(20, 30))
    serve(drafter, [1, 2], answer)
    serve(drafter, [3, 4], answer, stop_after=1)
    cache.reset()
    assert (cache.active_requests, cache.cached_requests) == (0, 0)
    assert len(drafter.propose([3, 4, 20, 21, 22])) == 0  # the dropped request drafts nothing
    first = serve(drafter, [5, 6], answer)
    assert not any(len(t) for t in first)  # nothing left to copy from


def _drafts(cache: SuffixTreeCache, request: int, contexts) -> list:
    config = SuffixConfig()
    found = []
    for context in contexts:
        draft = cache.speculate(request, context, config)
        found.append(draft and (list(draft.token_ids), list(draft.parents), list(draft.probs)))
    return found


def test_a_replayable_cache_is_copied_by_making_its_calls_again():
    """The Compare tab warms SuffixDecoding once and copies it for every repeat: the copy holds the same
    trees (the same drafts on any context), the same open request, and learns on its own."""
    cache = SuffixTreeCache(replayable=True)
    drafter = SuffixDecodingDrafter(cache)
    serve(drafter, [1, 2], [*range(20, 36), EOS])
    serve(drafter, [3, 4], [20, 21, 40, 41, 42, 43, 20, 21, 22], stop_after=2)  # left open
    twin = copy.deepcopy(drafter)
    assert twin.cache is not cache and twin.request_id == drafter.request_id is not None
    assert (twin.cache.active_requests, twin.cache.cached_requests) == (1, 2)
    contexts = [[3, 4, 20, 21, 40], [5, 20, 21], [9, 30, 31, 32], [41, 42], [7]]
    shown = _drafts(cache, drafter.request_id, contexts)
    assert any(d and d[0] for d in shown) and _drafts(twin.cache, twin.request_id, contexts) == shown
    serve(twin, [5, 6], [50, 51, 52, 53, EOS])  # the copy learns another answer; the original does not
    assert (cache.cached_requests, twin.cache.cached_requests) == (2, 3)
    assert cache.active_requests == 1 and twin.cache.active_requests == 0  # the twin's begin closed its own
    assert _drafts(cache, drafter.request_id, contexts) == shown
    cache.reset()  # forgets its log too
    assert copy.deepcopy(cache).cached_requests == 0


def test_a_shared_cache_keeps_no_log_and_is_not_copied():
    cache = SuffixTreeCache()
    serve(SuffixDecodingDrafter(cache), [1, 2], [20, 21, 22])
    with pytest.raises(TypeError, match=r"keeps no log .*\(SuffixTreeCache\(replayable=True\) can\)"):
        copy.deepcopy(cache)


# --------------------------------------------------------------------------- without the package
@pytest.fixture
def without_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import now fails


def test_missing_package_names_the_install_command(without_package):
    with pytest.raises(ValueError, match=INSTALL_COMMAND):
        make_drafter("suffix")
    assert INSTALL_COMMAND == "bash scripts/install_suffix.sh"
    make_drafter("tr")  # other methods do not need it


def test_bench_cli_says_how_to_install_before_loading_a_model(without_package, tmp_path, capsys):
    code = bench.main(["--model", "no/such/model", "--methods", "suffix", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and INSTALL_COMMAND in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------- real (tiny) models
PROMPT = "describe the image. what colour is the square?"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_second_identical_request_is_drafted_and_stays_lossless(arch):
    runtime = Runtime(tiny(arch))
    images = [] if runtime.target.family == "text" else [noise_image(3)]
    truth = reference_greedy(runtime.target, PROMPT, images, 32)
    cache = SuffixTreeCache()
    first = generate(
        runtime.target,
        runtime.drafter("suffix", state=DrafterState.given(runtime.target.vocab_size, suffix_cache=cache)),
        PROMPT,
        images,
        32,
    )
    second = generate(
        runtime.target,
        runtime.drafter("suffix", state=DrafterState.given(runtime.target.vocab_size, suffix_cache=cache)),
        PROMPT,
        images,
        32,
    )
    assert first.tokens == second.tokens == truth
    # the global tree holds the first answer: the second one is mostly drafted
    drafted = sum(s.accepted_len for s in second.steps)
    assert drafted >= len(truth) // 2, (arch, drafted)
    nodes = [n for s in second.steps for n in s.nodes]
    assert nodes and {tuple(n.sources) for n in nodes} == {(SOURCE,)}
    assert set(second.steps[1].new_sources) <= {SOURCE, "target"}


def test_a_cancelled_stream_is_stopped_and_the_next_request_is_lossless():
    runtime = Runtime(tiny("llava"))
    cache = SuffixTreeCache()
    drafter = runtime.drafter(
        "suffix", state=DrafterState.given(runtime.target.vocab_size, suffix_cache=cache)
    )
    stream = generate_steps(runtime.target, drafter, PROMPT, [noise_image(1)], 32)
    next(stream), next(stream)
    stream.close()  # the visitor pressed Stop
    cancelled = drafter.request_id
    assert cancelled is not None and cache.active_requests == 1
    result = generate(runtime.target, drafter, "the cat is", [noise_image(2)], 24)
    assert result.tokens == reference_greedy(runtime.target, "the cat is", [noise_image(2)], 24)
    # the cancelled request was stopped; the new one is open unless it ended with an EOS
    still_open = 0 if result.steps[-1].finish_reason == "eos" else 1
    assert drafter.request_id != cancelled and cache.active_requests == still_open
    assert cache.cached_requests == 2


def test_runtime_shares_one_cache_per_model():
    runtime = Runtime(tiny("llama"))
    assert runtime.drafter("suffix").cache is runtime.drafter("suffix").cache is runtime.state.suffix_cache()
    config = SuffixConfig(max_spec_tokens=4)
    assert (
        runtime.drafter(
            "suffix",
            state=DrafterState.given(
                runtime.target.vocab_size, suffix_cache=runtime.state.suffix_cache(), suffix_config=config
            ),
        ).config.max_spec_tokens
        == 4
    )
