"""The benchmark summaries that ship for the Compare tab are those of the current code's trees.

AR's passes (the answer's length) must match exactly. The tree methods rank candidates by float32
scores, and a near tie can fall the other way under another release of torch, numpy or numba or on
another CPU, so their passes on the checked samples may drift by `DRIFT` of the recorded total (at
least `MIN_DRIFT` passes); a drafter change that alters RECAP's trees at all fails the model-free
replay in ``tests/test_stream_replay.py``.
"""

from __future__ import annotations

import pytest

from recap.bench.datasets import load_dataset
from recap.studio.ui import measure
from scripts import compare_summary

#: How far a tree method's passes on the checked samples may move from the recorded total.
DRIFT = 0.10
MIN_DRIFT = 2

SHIPPED = {
    version: measure.load_summary(str(folder)) for version, (folder, _) in compare_summary.MODELS.items()
}


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(SHIPPED))
def test_the_shipped_summary_matches_the_current_trees_on_its_first_samples(version):
    summary = SHIPPED[version]
    folder, dataset = compare_summary.MODELS[version]
    if not (folder / "config.json").is_file():
        pytest.skip(f"the embedded model {version} is not in assets/models")
    assert summary is not None, f"no summary ships for {folder.name}: run {measure.SUMMARY_COMMAND}"
    check = summary["check"]
    methods = [m for m in check["passes"] if m in compare_summary.methods_here()]
    runtime = compare_summary.Runtime.load(str(folder), device="cpu")
    samples = load_dataset(dataset, check["limit"])[: check["samples"]]
    data = compare_summary.run_on(runtime, samples, methods)
    now = compare_summary.per_sample_passes(data, methods, check["samples"])
    here = compare_summary.environment()
    recorded = summary.get("environment", {})
    moved = {k: f"{old} -> {here.get(k)}" for k, old in recorded.items() if here.get(k) != old}
    stale = (
        f"the trees changed: rebuild with {summary['command']} (now {now}, recorded "
        f"{check['passes']}; packages changed since it was built: {moved or 'none'})"
    )
    assert now["ar"] == check["passes"]["ar"], stale
    for method in methods:
        shipped, current = sum(check["passes"][method]), sum(now[method])
        assert abs(current - shipped) <= max(MIN_DRIFT, DRIFT * shipped), f"{method}: {stale}"


def test_every_embedded_model_ships_a_summary_the_tab_can_show():
    for version, summary in SHIPPED.items():
        assert summary is not None, version
        line = measure.summary_line(summary)
        assert line.startswith(f"**Recorded beforehand, not on this input: {summary['samples']} held-out")
        assert "RECAP" in line
        more, tied, fewer = summary["sample_wins"]["recap"]  # scene by scene, against TR
        assert 0 < more + tied + fewer <= summary["samples"] and "Scene by scene" in line
