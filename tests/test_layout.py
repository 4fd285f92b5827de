"""The Compare and Sensitivity tabs lead with the held-out figure; this input's panels follow it."""

from __future__ import annotations

import gradio as gr
import pytest

from recap.studio.environment import DEFAULT_MODEL_ID
from recap.studio.ui import layout, measure


def _order(tab) -> list[str]:
    """The elem_ids of the components the tab function creates, in page order."""
    with gr.Blocks() as blocks:
        made = tab()
    ids = [b.elem_id for b in blocks.blocks.values() if getattr(b, "elem_id", None)]
    return ids, made


@pytest.mark.parametrize(
    ("tab", "first", "then"),
    [
        (layout.compare_tab, "compare-summary", ["compare-status", "compare-table", "compare-story"]),
        (layout.sensitivity_tab, "sensitivity-summary", ["sensitivity-status", "sensitivity-table"]),
    ],
)
def test_the_held_out_figure_comes_first(tab, first, then):
    ids, made = _order(tab)
    assert ids[0] == first and all(ids.index(first) < ids.index(later) for later in then), ids
    assert made["summary"].value == measure.held_out_line(DEFAULT_MODEL_ID) != ""
