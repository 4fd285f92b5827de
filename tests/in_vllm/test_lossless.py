"""RECAP inside vLLM equals vLLM without speculation, token for token (greedy, float32), in every
scenario of `scenario.py`; the proposer lets finished and aborted requests go."""

from __future__ import annotations

from collections import Counter

import pytest

pytestmark = pytest.mark.vllm


def tokens(results: dict, scenario: str) -> dict[str, list[int]]:
    return {req_id: output["tokens"] for req_id, output in results[scenario].items()}


@pytest.mark.parametrize("scenario", ["batch", "join", "limit", "after", "last"])
def test_greedy_output_equals_vllm_without_speculation(scenarios, scenario):
    plain, recap = tokens(scenarios["none"], scenario), tokens(scenarios["recap"], scenario)
    assert set(plain) == set(recap)
    aborted = {"j3"} if scenario == "join" else set()
    for req_id in set(plain) - aborted:
        assert recap[req_id] == plain[req_id], f"{scenario}: request {req_id} differs"
    for req_id in aborted:  # stopped mid-answer: what it had is the start of the plain answer
        assert plain[req_id][: len(recap[req_id])] == recap[req_id][: len(plain[req_id])]


def test_the_scenarios_cover_what_they_claim(scenarios):
    plain = scenarios["none"]
    lengths = {len(output["tokens"]) for output in plain["batch"].values()}
    assert len(plain["batch"]) == 8 and len(lengths) >= 7  # eight requests, of different lengths
    assert len(plain["join"]) == 6 and plain["join"]["j3"]["finish"] is None  # j3 was aborted running
    limit = plain["limit"]["l0"]
    assert limit["finish"] == "length" and plain["long_prompt_tokens"] + len(limit["tokens"]) == 384
    assert scenarios["recap"]["too_long"].startswith("refused: VLLMValidationError")


def test_recap_drafted_and_the_proposer_keeps_only_running_requests(scenarios):
    proposer = scenarios["recap"]["proposer"]
    assert proposer["accepted"] > 0.1 * proposer["passes"]  # its chains were accepted, often
    # finished and aborted requests are gone: only the last one, whose end the runner learns at the
    # engine's next step, is still held
    assert len(proposer["running"]) <= 1 and all(r.startswith("z0") for r in proposer["running"])


def total_variation(first: Counter, second: Counter) -> float:
    n, m = sum(first.values()), sum(second.values())
    return 0.5 * sum(abs(first[key] / n - second[key] / m) for key in set(first) | set(second))


@pytest.mark.xfail(
    strict=True,
    reason="vLLM 0.32's CPU rejection sampler changes the sampled distribution of proposers without "
    "draft probabilities (its own ngram too: docs/vllm.md); strict, so a fixed vLLM makes this pass",
)
def test_seeded_sampling_keeps_the_distribution_of_no_speculation(scenarios):
    """160 seeded answers of 4 tokens at temperature 1: the third and fourth tokens (drafted) are
    distributed as without speculation (total variation under 0.15; the two plain halves differ by
    less than that)."""
    plain, recap = (list(scenarios[m]["sampled"].values()) for m in ("none", "recap"))
    for position in (2, 3):
        expected = Counter(output["tokens"][position] for output in plain)
        found = Counter(output["tokens"][position] for output in recap)
        assert total_variation(expected, found) < 0.15, f"token {position}"
