"""The trace format: real runs round-trip through JSON; fields added later load from older traces.

(A stranger's trace file, bounded and checked: tests/test_trace_files.py.)
"""

from __future__ import annotations

import json

import pytest
from conftest import noise_image, tiny

from recap.decode import generate
from recap.drafters.recap.config import RecapConfig
from recap.runtime import Runtime
from recap.sampling import SamplingSettings
from recap.studio.guard.trace_files import check_trace_data
from recap.trace import RunTrace


@pytest.mark.parametrize("method", ["recap", "tr", "pld", "ar"])
def test_real_runs_round_trip(method):
    target = tiny("llava")
    result = generate(
        target, Runtime(target).drafter(method), "the cat is", [noise_image(1)], 16, method=method
    )
    text = result.trace({"method": method}).to_json()
    loaded = RunTrace.from_json(text)
    assert loaded.tokens == result.tokens and loaded.to_json() == text


def test_a_sampled_run_round_trips_with_its_draws():
    target = tiny("llava")
    sampling = SamplingSettings(temperature=0.8, seed=1)
    result = generate(
        target, Runtime(target).drafter("tr"), "the cat is", [noise_image(1)], 16, sampling=sampling
    )
    loaded = RunTrace.from_json(result.trace({"method": "tr"}).to_json())
    assert [s.draws for s in loaded.steps] == [s.draws for s in result.steps]
    assert any(s.draws for s in loaded.steps)


def test_nodes_say_whether_this_requests_records_proposed_them():
    # The node tooltip's "from this image's own records": in the stream's first request every record is
    # this request's; in the next one, some nodes come from the first request's records (another image)
    target = tiny("llava")
    drafter = Runtime(target).drafter("recap", config=RecapConfig(budget=8, suffix=False))
    first = generate(target, drafter, "the cat is the cat is", [noise_image(0)], 24, method="recap")
    remembered = [n for s in first.steps for n in s.nodes if n.contributions]
    assert remembered and all(n.this_request for n in remembered)
    second = generate(target, drafter, "a dog", [noise_image(1)], 24, method="recap")
    flags = {n.this_request for s in second.steps for n in s.nodes if n.contributions}
    assert flags == {True, False}
    # older traces have no such field: they load, the flag reads False
    data = json.loads(second.trace({"method": "recap"}).to_json())
    for step in data["steps"]:
        for node in step["nodes"]:
            del node["this_request"]
    assert not any(n.this_request for s in RunTrace.from_json(json.dumps(data)).steps for n in s.nodes)
    data["steps"][1]["nodes"][0]["this_request"] = "yes"
    with pytest.raises(ValueError, match="this_request"):
        check_trace_data(data)
