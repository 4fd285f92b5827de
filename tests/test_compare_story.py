"""scripts.compare_story reads each method's counts off the Compare tab's story line."""

from __future__ import annotations

from recap.studio.ui import story
from scripts import compare_story


def test_the_counts_are_read_off_the_line_the_tab_shows():
    line = (
        "5 of the 39 tokens after the first depend on the image (the greedy token changes when the image"
        " is replaced by a blank one). Accepted drafts there (drafted there): Prompt lookup 0 (2), Token"
        " Recycling 7 (9), RECAP 6 (9). Token Recycling's ..."
    )
    expected = {"Prompt lookup": (0, 2), "Token Recycling": (7, 9), "RECAP": (6, 9)}
    assert compare_story.counts(line) == expected
    assert compare_story.counts(story.story_html(line)) == expected  # as the page gets it
    none = "0 of the 11 tokens after the first depend on the image. So no drafter can be told apart"
    assert compare_story.counts(none) == {}


def test_the_depth_split_is_read_off_the_line_the_tab_shows():
    from test_studio_memory import AR, LABELS, RECAP, TR

    line = story.story_line({"ar": AR, "tr": TR, "recap": RECAP}, [False, True, True, False], LABELS)
    found = compare_story.DEPTHS.search(story.story_html(line))
    assert (found["first"], found["deeper"]) == ("TR 1 of 2, RECAP 1 of 1", "TR none met there, RECAP 1 of 1")


def test_a_fresh_studio_tells_the_story_on_the_shipped_examples(monkeypatch, capsys):
    """The Compare tab on a fresh server, default settings, each shipped example of the default model as
    a click sends it: RECAP accepts at least as many drafts as Token Recycling at the image-dependent
    tokens on at least 5 of the 6, and strictly more on the first (the page's default, chosen because
    its story shows the mechanism; docs/studio.md gives every example's counts). The counts do not
    depend on the timed repeats: one is enough."""
    import torch

    from recap.studio.ui import measure

    monkeypatch.setattr(measure, "REPEATS", 1)
    threads = torch.get_num_threads()
    try:
        assert compare_story.main([]) == 0
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.strip().splitlines()
    wins = int(lines[-1].split(" on ")[-1].split(" of ")[0])
    assert lines[-1].endswith("of 6") and wins >= 5, lines[-1]
    first = {m["label"].strip(): int(m["accepted"]) for m in compare_story.PART.finditer(lines[0])}
    assert first["RECAP"] > first["Token Recycling"], lines[0]
