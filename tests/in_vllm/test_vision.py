"""The embedded vision model (LLaVA) in vLLM with its images, through vLLM's Transformers backend
(``model_impl="transformers"``: vLLM's own LLaVA imports torchvision, which does not load beside the CPU
torch). Eight ``scenes2`` scenes at once: vLLM's greedy answers equal transformers' own ``generate``
(the model code this project's engine runs), RECAP's equal vLLM's without speculation, token for token,
and each running request's 2- and 3-token memories hold its own tokens only, never an image
placeholder (``RECAP_VLLM_CONTEXT_SCOPE=stream`` shares them: the check sees that)."""

from __future__ import annotations

import pytest

from .conftest import ROOT, run_scenario

pytestmark = pytest.mark.vllm

VISION_MODEL = ROOT / "assets/models/tiny-scenes-llava-v2"
SCENES = 8
#: ``image_token_index`` in the model's config.json: the id of its 64 image placeholders in a prompt.
IMAGE_TOKEN = 3


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> dict[str, dict]:
    """Each engine's results: ``none`` and ``recap`` in vLLM, ``transformers`` (its ``generate``), and
    ``stream`` (RECAP with the stream's contextual memories)."""
    folder = tmp_path_factory.mktemp("vllm-vision")
    runs = {"none": {}, "recap": {}, "transformers": {}, "stream": {"RECAP_VLLM_CONTEXT_SCOPE": "stream"}}
    results = {}
    for name, env in runs.items():
        method = "recap" if name == "stream" else name
        extra = ("--scenes", str(SCENES))
        results[name] = run_scenario(method, folder / f"{name}.json", VISION_MODEL, extra, env)
    return results


def answers(results: dict) -> dict[str, list[int]]:
    return {req_id: output["tokens"] for req_id, output in results["outputs"].items()}


def test_vllm_answers_the_scenes_as_transformers_does(scenes):
    vllm, reference = scenes["none"]["outputs"], scenes["transformers"]["outputs"]
    assert set(vllm) == set(reference) and len(vllm) == SCENES
    for req_id, output in reference.items():
        assert vllm[req_id]["prompt"] == output["prompt"], f"{req_id}: the prompts differ"
        assert output["prompt"].count(IMAGE_TOKEN) == 64  # the image's placeholders, in both
        assert vllm[req_id]["tokens"] == output["tokens"], f"{req_id}: the answers differ"
    assert len({tuple(tokens) for tokens in answers(scenes["none"]).values()}) == SCENES


@pytest.mark.parametrize("run", ["recap", "stream"])
def test_recap_equals_vllm_without_speculation(scenes, run):
    assert answers(scenes[run]) == answers(scenes["none"])


def test_each_request_keeps_contextual_memories_of_its_own(scenes):
    proposer = scenes["recap"]["proposer"]
    assert proposer["excluded"] == [IMAGE_TOKEN]  # read from the model's config
    assert proposer["accepted"] > 0.2 * proposer["passes"]  # its chains were accepted, often
    assert proposer["most_running"] == SCENES and proposer["most_keys"] > 50  # the check saw memories
    assert proposer["shared_steps"] == 0
    assert proposer["foreign"] == {}  # every key is a run of the request's own tokens
    assert proposer["placeholder_keys"] == []


def test_stream_scope_shares_them_and_the_check_sees_it(scenes):
    proposer = scenes["stream"]["proposer"]
    assert proposer["shared_steps"] > 0 and len(proposer["foreign"]) == SCENES
    assert proposer["placeholder_keys"] == []
