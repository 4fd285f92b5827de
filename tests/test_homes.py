"""One home per concept: the source table, a node's main source, the RECAP family, the sensitivity split."""

from __future__ import annotations

from dataclasses import astuple

import pytest

from recap.bench.sensitivity import split_against_reference
from recap.drafters import METHODS, is_recap_method
from recap.tree import SOURCE_TABLE, SOURCES, main_source


@pytest.mark.parametrize(
    ("sources", "contributions", "expected"),
    [
        (("ctx2", "persistent"), {"ctx2": 0.1, "persistent": 0.3}, "persistent"),  # largest share
        (("suffix", "ctx3"), {}, "suffix"),  # no shares: the first listed
        ((), {}, "unknown"),
    ],
)
def test_main_source(sources, contributions, expected):
    assert main_source(sources, contributions) == expected


def test_source_table_has_one_row_per_name_with_a_colour_and_a_meaning():
    names = [s.name for s in SOURCE_TABLE]
    assert len(names) == len(set(names)) and {"target", "unknown"} <= set(names)
    assert all(s.color.startswith("#") and len(s.color) == 7 and s.meaning for s in SOURCE_TABLE)
    assert set(SOURCES) == set(names) - {"target", "unknown"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("recap", True),
        ("recap-no-suffix", True),
        ("recap-template", True),
        ("tr", False),
        ("pld", False),
        ("ar", False),
        ("recapitulate", False),
    ],
)
def test_is_recap_method(name, expected):
    assert is_recap_method(name) is expected


def test_every_recap_method_is_recognised():
    assert [m for m in METHODS if is_recap_method(m)] == [m for m in METHODS if m.startswith("recap")]


@pytest.mark.parametrize(
    ("tokens", "sources", "expected"),
    [
        # agrees with the reference: every position but the first counts
        ([5, 8, 2], ["target", "ctx2", "ctx3"], (1, 1, 1, 1)),
        # differs at the third token: that position is not the reference's, so it is left out
        ([5, 8, 3], ["target", "ctx2", "ctx3"], (1, 1, 0, 0)),
        # longer than the reference: clipped to it
        ([5, 8, 2, 9], ["target", "target", "ctx3", "ctx3"], (0, 1, 1, 1)),
    ],
)
def test_split_against_reference_counts_only_where_the_outputs_agree(tokens, sources, expected):
    split = split_against_reference(tokens, sources, [5, 8, 2], [False, True, False])
    # (sensitive drafted, sensitive total, insensitive drafted, insensitive total), in field order
    assert astuple(split) == expected
