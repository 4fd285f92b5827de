"""Runtime: one shared memory per model and method, budgets, and the memory file."""

from __future__ import annotations

import pytest
from conftest import tiny

from recap.config import RecapConfig
from recap.drafters import shared_state
from recap.runtime import Runtime, parse_budget


def test_drafters_share_memories_per_method():
    runtime = Runtime(tiny("llava"))
    first, again, ablation = (runtime.drafter(m, budget=8) for m in ("recap", "recap", "recap-uniform"))
    # the same memory for every request of a method, none shared between methods
    assert first.persistent is again.persistent is runtime.persistent_memory(8, "recap")
    assert ablation.persistent is not first.persistent
    assert runtime.drafter("tr").successors is runtime.drafter("tr").successors


def test_budget_overrides_the_config():
    runtime = Runtime(tiny("llava"))
    assert runtime.drafter("recap", budget=5).config.budget == 5
    assert runtime.drafter("recap").config.budget == "auto"


@pytest.mark.parametrize(("value", "expected"), [("auto", "auto"), (" AUTO ", "auto"), ("16", 16), (0, 0)])
def test_parse_budget(value, expected):
    assert parse_budget(value) == expected


@pytest.mark.parametrize("value", ["lots", "-1", "1000", None])
def test_parse_budget_rejects(value):
    with pytest.raises(ValueError, match="budget"):
        parse_budget(value)


def test_memory_file_round_trip_through_runtime(tmp_path):
    runtime = Runtime(tiny("llava"))
    memory = runtime.persistent_memory()
    memory.write_many([5], [[6, 7, 0, 0, 0, 0, 0, 0]], [[0.9, 0.1, 0, 0, 0, 0, 0, 0]])
    path = tmp_path / "p1.safetensors"
    runtime.save_persistent_memory(path)
    loaded = Runtime(tiny("llava")).load_persistent_memory(path)
    assert loaded.lookup(5).ids[:2] == [6, 7]


@pytest.mark.parametrize(
    ("method", "budget", "needs"),
    [
        ("ar", "auto", set()),
        ("pld", "auto", set()),
        ("tr", "auto", {"successors"}),
        ("suffix", "auto", {"suffix_cache"}),
        ("recap", "auto", {"persistent", "cost_model"}),
        ("recap", 32, {"persistent"}),
        ("recap-no-context", 32, {"persistent"}),
    ],
)
def test_each_method_declares_the_shared_state_it_needs(method, budget, needs):
    assert shared_state(method, RecapConfig(budget=budget)) == needs


def test_a_runtime_builds_only_the_state_a_method_declares():
    runtime = Runtime(tiny("llama"))
    for method in ("ar", "pld", "tr"):
        runtime.drafter(method)
    assert runtime._memories == {} and runtime.measured_cost() is None  # no vocab x k memory, no timing
    runtime.drafter("recap", budget=8)
    assert len(runtime._memories) == 1 and runtime.measured_cost() is None
