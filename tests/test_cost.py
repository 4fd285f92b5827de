"""Cost curves (`recap.models.cost`): how far a measured curve is flat, and reading a recorded one."""

from __future__ import annotations

import pytest

from recap.models.cost import MAX_TREE, CostModel, load_curve

H200 = [(1, 3.151), (4, 3.537), (8, 2.904), (16, 3.46), (32, 3.486), (64, 3.516)]  # ms, recorded
CPU = [(1, 2.004), (4, 2.45), (8, 2.374), (16, 2.955), (32, 3.731), (64, 4.866)]


@pytest.mark.parametrize(
    ("points_ms", "extent"),
    [
        (H200, 128),  # flat within its noise; trusted to twice the largest measured size
        (CPU, 0),  # a 2-core CPU: T = 4 already costs 22% more
        ([(1, 1.0), (256, 1.0)], MAX_TREE),  # perfectly flat
        ([(1, 1.0), (8, 1.04), (16, 2.0)], 8),  # flat (within 5%) until the step
    ],
)
def test_flat_extent(points_ms, extent):
    assert CostModel([(t, ms / 1e3) for t, ms in points_ms]).flat_extent() == extent


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[[1, 3.1], [64, 3.5]]", None),
        ('{"settings": {"cost_curve_ms": {"measured": [[1, 3.1], [64, 3.5]], "fitted": []}}}', None),
        ("not json", "not readable JSON"),
        ('{"settings": {}}', "no cost curve found"),
        ('[[1, "fast"]]', "bad cost curve point"),
        ("[[0, 1.0]]", "tokens >= 1"),
    ],
)
def test_load_curve(tmp_path, content, message):
    path = tmp_path / "curve.json"
    path.write_text(content)
    if message is None:
        assert load_curve(path).points == ((1, pytest.approx(3.1e-3)), (64, pytest.approx(3.5e-3)))
    else:
        with pytest.raises(ValueError, match=message):
            load_curve(path)


def test_load_curve_of_a_missing_file_names_it(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        load_curve(tmp_path / "absent.json")
