"""The benchmark summaries that ship for the Compare tab are those of the current code's trees."""

from __future__ import annotations

import pytest

from recap.bench.datasets import load_dataset
from recap.studio import measure
from scripts import compare_summary

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
    stale = f"the trees changed: rebuild with {summary['command']}"
    assert now == {m: check["passes"][m] for m in methods}, stale


def test_every_embedded_model_ships_a_summary_the_tab_can_show():
    for version, summary in SHIPPED.items():
        assert summary is not None, version
        line = measure.summary_line(summary)
        assert line.startswith(f"**On {summary['samples']} held-out scenes**") and "RECAP" in line
