"""A stranger's trace file (`recap.studio.guard.trace_files`): a hostile or broken file is refused with a
message naming the problem, before any record is built; a well-formed one reads as its records.
"""

from __future__ import annotations

import copy
import json

import pytest
from conftest import noise_image, tiny

from recap.decode import generate
from recap.drafters.recap.config import RecapConfig
from recap.runtime import Runtime
from recap.studio.guard.trace_files import (
    MAX_TRACE_BYTES,
    MAX_TRACE_STEPS,
    check_trace_data,
    read_trace,
    trace_from_text,
)


@pytest.fixture(scope="module")
def recorded() -> dict:
    """The JSON form of a real RECAP run on the tiny LLaVA (trees with several nodes per step)."""
    target = tiny("llava")
    drafter = Runtime(target).drafter("recap", config=RecapConfig(budget=8))
    result = generate(target, drafter, "the cat is the cat is", [noise_image(0)], 24, method="recap")
    assert any(len(s.nodes) > 1 for s in result.steps), "the fixture needs steps with trees"
    return json.loads(result.trace({"model": "tiny", "method": "recap"}).to_json())


def _step_with_nodes(data: dict) -> dict:
    return next(s for s in data["steps"] if len(s["nodes"]) > 1)


def _mutate(data: dict, case: str) -> dict | list | str:
    data = copy.deepcopy(data)
    step = _step_with_nodes(data)
    nodes = step["nodes"]
    if case == "own parent":
        nodes[1]["parent"] = 1
    elif case == "cycle":
        nodes[0]["parent"], nodes[1]["parent"] = 1, 0
    elif case == "parent after":
        nodes[0]["parent"] = len(nodes) - 1
    elif case == "wrong depth":
        nodes[0]["depth"] = 5
    elif case == "missing field":
        del nodes[0]["token"]
    elif case == "string token":
        nodes[0]["token"] = "7"
    elif case == "bool token":
        nodes[0]["token"] = True
    elif case == "negative token":
        step["new_tokens"][0] = -3
    elif case == "huge token":
        nodes[0]["token"] = 2**40
    elif case == "huge step":
        step["step"] = 10**15
    elif case == "score object":
        nodes[0]["score"] = {"x": 1}
    elif case == "sources not list":
        nodes[0]["sources"] = "ctx3"
    elif case == "accepted elsewhere":
        step["accepted_ids"] = [len(nodes) + 4]
    elif case == "lengths differ":
        step["new_texts"] = step["new_texts"] + ["extra"]
    elif case == "step not object":
        data["steps"][0] = [1, 2]
    elif case == "no method":
        del data["steps"][0]["method"]
    elif case == "settings nested":
        data["settings"]["model"] = {"a": [1]}
    elif case == "settings list":
        data["settings"] = ["model"]
    elif case == "steps not list":
        data["steps"] = {"0": {}}
    elif case == "top list":
        return [data]
    elif case == "newer version":
        data["version"] = 99
    elif case == "long token text":
        nodes[0]["text"] = "x" * 5000
    elif case == "draws not list":
        step["draws"] = {"token": 1}
    elif case == "draw pair":
        step["draws"] = [{"tried": [[1, 0.5, 9]], "token": 1, "residual": False}]
    elif case == "draw residual":
        step["draws"] = [{"tried": [], "token": 1, "residual": "<b>yes</b>"}]
    return data


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("own parent", "parent 1"),  # a node that is its own parent
        ("cycle", "parent 1"),  # two nodes each other's parent: the first one already fails
        ("parent after", "listed before it"),
        ("wrong depth", "depth 5"),
        ("missing field", "has no 'token'"),
        ("string token", "'token' must be a whole number"),
        ("bool token", "'token' must be a whole number"),
        ("negative token", "'new_tokens' must be a whole number from 0"),
        ("huge token", "2**31"),
        ("huge step", "'step' must be a whole number from 0 to 2**31 - 1"),
        ("score object", "'score' must be a finite number"),
        ("sources not list", "'sources' must be a list"),
        ("accepted elsewhere", "'accepted_ids' must name distinct nodes"),
        ("lengths differ", "differ in length"),
        ("step not object", "step 0 is not an object"),
        ("no method", "has no 'method'"),
        ("settings nested", "plain values"),
        ("settings list", "'settings' must be an object"),
        ("steps not list", "'steps' list"),
        ("top list", "'steps' list"),
        ("newer version", "newer than this RECAP"),
        ("long token text", "at most 1000 characters"),
        ("draws not list", "'draws' must be a list"),
        ("draw pair", "[token, probability] pairs"),
        ("draw residual", "'residual' must be true or false"),
    ],
)
def test_malformed_traces_are_refused_with_the_reason(recorded, case, message):
    with pytest.raises(ValueError, match="trace") as caught:
        trace_from_text(json.dumps(_mutate(recorded, case)))
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"steps": [{"step": 0, "committed_len": 1, "method": "ar", "target_prob": NaN}]}', "NaN"),
        ('{"steps": [{"step": 0, "committed_len": 1, "method": "ar", "target_prob": Infinity}]}', "Infinity"),
        ('{"steps": [{"step": 0, "committed_len": 1, "method": "ar", "target_prob": 1e999}]}', "finite"),
        ('{"steps": [{"step": ' + "9" * 5000 + "}]}", "a number has thousands of digits"),
        # a lone surrogate: JSON carries it, no UTF-8 answer can (gradio failed to send the replay)
        ('{"steps": [{"step": 0, "committed_len": 1, "method": "\\ud800"}]}', "method' is not valid Unicode"),
        ('{"settings": {"model": "\\udcff"}, "steps": []}', "setting 'model' is not valid Unicode"),
        ('{"text": "\\ud800", "steps": []}', "'text' is not valid Unicode"),
    ],
)
def test_unparseable_json_is_refused_with_the_reason(text, message):
    with pytest.raises(ValueError, match=message) as caught:
        trace_from_text(text)
    assert "sys." not in str(caught.value)  # (Python's own advice about its settings is not passed on)


def test_an_escaped_surrogate_pair_is_a_character_a_trace_can_hold():
    # (json.dumps writes an emoji as a pair of escapes; only a lone one is refused)
    trace = trace_from_text('{"steps": [{"step": 0, "committed_len": 1, "method": "\\ud83d\\ude00"}]}')
    assert trace.steps[0].method == "\U0001f600"


def test_a_20000_node_chain_is_refused_as_too_large():
    chain = [
        {
            "id": i,
            "parent": i - 1,
            "token": 1,
            "text": "a",
            "depth": i + 1,
            "score": 0.5,
            "sources": ["ctx3"],
            "contributions": {},
            "accepted": False,
        }
        for i in range(20_000)
    ]
    data = {"steps": [{"step": 1, "committed_len": 3, "method": "recap", "nodes": chain}]}
    with pytest.raises(ValueError, match="20000 nodes; the limit is"):
        check_trace_data(data)


def test_too_many_steps_and_too_many_bytes_are_refused(tmp_path):
    steps = [{"step": i, "committed_len": i, "method": "ar"} for i in range(MAX_TRACE_STEPS + 1)]
    with pytest.raises(ValueError, match="steps; the limit is"):
        check_trace_data({"steps": steps})
    big = tmp_path / "big.json"
    big.write_text('{"steps": [], "text": "' + "x" * MAX_TRACE_BYTES + '"}')
    with pytest.raises(ValueError, match="too large"):
        read_trace(big)
