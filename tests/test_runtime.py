"""Runtime: one shared memory per model and method, budgets, and the memory file."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import tiny

from recap import runtime as runtime_module
from recap.drafters import shared_state
from recap.drafters.recap.config import RecapConfig
from recap.models.cost import steady_curve
from recap.runtime import CPU_COST_MAX_SWEEPS, CPU_COST_SWEEPS, Runtime, parse_budget


def test_drafters_share_memories_per_method():
    runtime = Runtime(tiny("llava"))
    first, again, ablation = (runtime.drafter(m, budget=8) for m in ("recap", "recap", "recap-uniform"))
    # the same memory for every request of a method, none shared between methods
    assert first.persistent is again.persistent is runtime.state.persistent("recap", 8)
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
    memory = runtime.state.persistent()
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
    assert runtime.state.memories() == {} and runtime.measured_cost() is None  # no vocab x k memory
    runtime.drafter("recap", budget=8)
    assert list(runtime.state.memories()) == [("recap", 8)] and runtime.measured_cost() is None


# ------------------------------------------------------------------------------ the cost curve
@pytest.mark.parametrize(
    ("sweeps", "expected"),
    [
        # each size keeps its fastest pass: a burst of load in one sweep does not make the curve steep
        ([[(1, 1.0), (8, 9.0)], [(1, 3.0), (8, 1.5)]], ((1, 1.0), (8, 1.5))),
        ([[(1, 2.0), (4, 2.5), (16, 4.0)]], ((1, 2.0), (4, 2.5), (16, 4.0))),  # one sweep: as measured
    ],
)
def test_steady_curve_keeps_each_sizes_fastest_pass(sweeps, expected):
    assert steady_curve(sweeps).points == expected


@pytest.mark.parametrize("sweeps", [[], [[(1, 1.0), (8, 2.0)], [(1, 1.0), (16, 2.0)]]])
def test_steady_curve_refuses_sweeps_that_do_not_match(sweeps):
    with pytest.raises(ValueError, match="sweep"):
        steady_curve(sweeps)


@pytest.mark.parametrize(("threads", "clock"), [(1, time.thread_time), (2, time.perf_counter)])
def test_a_cpu_measures_the_curve_in_sweeps_on_this_threads_cpu_time(monkeypatch, threads, clock):
    # One thread: the pass runs in this thread, so its CPU time is its cost whatever else the machine
    # runs. Several threads: this thread's CPU time would miss the others' work, so wall-clock time.
    target = tiny("llama")
    calls = []

    def measured(sizes=(1, 4), context=256, repeats=3, clock=time.perf_counter):
        calls.append((repeats, clock))
        return [(1, 1e-3 * len(calls)), (4, 2e-3 / len(calls))]

    monkeypatch.setattr(target, "measure_tree_cost", measured)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(runtime_module, "CPU_COST_SECONDS", 0.0)  # no time for more than the minimum
    model = Runtime(target).cost_model()
    assert calls == [(1, clock)] * CPU_COST_SWEEPS
    assert model.points == ((1, 1e-3), (4, 2e-3 / CPU_COST_SWEEPS))


def test_a_cheap_model_gets_more_sweeps_while_they_fit_in_the_time_allowed(monkeypatch):
    # Sweeps that take no time: as many as allowed, each size keeping its fastest pass over all.
    target = tiny("llama")
    calls = []

    def measured(sizes=(1, 4), context=256, repeats=3, clock=time.perf_counter):
        calls.append(repeats)
        return [(1, 1e-3 * len(calls)), (4, 2e-3 / len(calls))]

    monkeypatch.setattr(target, "measure_tree_cost", measured)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(runtime_module, "CPU_COST_SECONDS", 3600.0)
    model = Runtime(target).cost_model()
    assert len(calls) == CPU_COST_MAX_SWEEPS > CPU_COST_SWEEPS
    assert model.points == ((1, 1e-3), (4, 2e-3 / CPU_COST_MAX_SWEEPS))
