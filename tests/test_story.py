"""The Compare tab's story: a headline of at most two sentences, every count folded below it.

The runs are test_studio_memory's hand-checked ones: the answer « The» « red» « circle» « here»; TR's
tree offered « blue» where the answer says « red» (rejected) and accepted « circle»; RECAP's ctx2 node
« red» and ctx3 node « circle» were accepted.
"""

from __future__ import annotations

import re

import pytest
from test_studio_memory import AR, LABELS, RECAP, RECAP_LOSES, TR, _node, _step

from recap.studio.ui import story


def _shown(html: str) -> tuple[str, str]:
    """The headline a visitor reads, and the text folded in the details (tags stripped)."""
    headline = re.search(r'<p class="recap-story">(.*?)</p>', html).group(1)
    folded = re.search(r"<details.*?</details>", html, re.S)
    return headline, re.sub(r"<[^>]+>", " ", folded.group(0)) if folded else ""


def _sentences(text: str) -> int:
    """Sentences in ``text``, quoted tokens («…») left out (a quoted «.» ends none)."""
    return len(re.findall(r"[.!?](?:\s|$)", re.sub(r"«[^»]*»", "«»", text)))


@pytest.mark.parametrize(
    ("runs", "flags"),
    [
        ({"ar": AR, "tr": TR, "recap": RECAP}, [False, True, True, False]),
        ({"ar": AR, "tr": TR, "recap": RECAP_LOSES}, [False, True, True, False]),
        ({"ar": AR, "tr": TR, "recap": RECAP_LOSES}, [False, False, True, False]),
        ({"ar": AR, "tr": TR, "recap": RECAP}, [False, False, False, True]),
        ({"ar": AR, "tr": TR, "recap": RECAP}, [True, False, False, False]),
    ],
    ids=["recap-ahead", "level", "tr-ahead", "neither", "none-depend"],
)
def test_the_headline_is_at_most_two_sentences_and_the_counts_are_folded(runs, flags):
    html = story.story_html(story.story_line(runs, flags, LABELS))
    headline, folded = _shown(html)
    assert 1 <= _sentences(headline) <= 2, headline
    assert "␣" not in headline and "␣" not in folded  # space markers only in the figures' tooltips
    if any(flags[1:]):
        assert "Accepted drafts there (drafted there)" in folded and "Accepted drafts" not in headline
        assert story.DETAILS in html


def test_where_recap_is_ahead_the_headline_says_why_at_one_token():
    line = story.story_line({"ar": AR, "tr": TR, "recap": RECAP}, [False, True, True, False], LABELS)
    headline = line.split("\n\n")[0]
    assert headline == (
        "At the 2 tokens of this answer that depend on the image, RECAP accepted more drafts than TR "
        "(2 against 1). At «red», TR looked up the last token «The» alone and drafted «blue»; RECAP's "
        "draft came from its 2-token key."
    )


#: « a» « red» « and» « a» « blue»: TR's row for « a» holds « red» (what followed « a» before) where the
#: answer says « blue»; RECAP's ctx2 record (« and», « a»), written in this request, holds « blue».
MIXED = [" a", " red", " and", " a", " blue"]
AR_MIXED = [_step(i, [i + 1], [MIXED[i]], ["target"]) for i in range(5)]
TR_MIXED = [
    _step(0, [1], [" a"], ["target"]),
    _step(1, [2, 3, 4], [" red", " and", " a"], ["template", "template", "target"],
          [_node(0, -1, 2, " red"), _node(1, 0, 3, " and")], [0, 1]),
    _step(2, [5], [" blue"], ["target"], [_node(0, -1, 2, " red")]),
]  # fmt: skip
RECAP_MIXED = [
    _step(0, [1], [" a"], ["target"]),
    _step(1, [2, 3, 4], [" red", " and", " a"], ["ctx2", "ctx2", "target"],
          [_node(0, -1, 2, " red", ("ctx2",)), _node(1, 0, 3, " and", ("ctx2",))], [0, 1]),
    _step(2, [5], [" blue"], ["ctx2"], [_node(0, -1, 5, " blue", ("ctx2", "persistent"))], [0]),
]  # fmt: skip
RECAP_MIXED[2].nodes[0].this_request = True
RECAP_MIXED[2].new_tokens, RECAP_MIXED[2].new_texts = [5, 6], [" blue", "."]


def test_the_headline_names_the_mixed_context_of_tr_s_last_token_key():
    runs = {"ar": AR_MIXED, "tr": TR_MIXED, "recap": RECAP_MIXED}
    headline = story.story_line(runs, [False, True, False, False, True], LABELS).split("\n\n")[0]
    assert headline.endswith(
        "At «blue», TR looked up the last token «a» alone and drafted «red», what followed «a» earlier "
        "in this answer; RECAP's draft came from its 2-token key «and a», recorded under this image in "
        "this request."
    )


def test_where_tr_is_level_or_ahead_its_tokens_come_first_and_none_is_picked():
    runs = {"ar": AR, "tr": TR, "recap": RECAP_LOSES}
    level = story.story_line(runs, [False, True, True, False], LABELS).split("\n\n")[0]
    assert level == (
        "At the 2 tokens of this answer that depend on the image, RECAP and TR accepted as many drafts (1). "
        "TR's draft was accepted where RECAP's was not at «circle»; RECAP's where TR's was not at «red»."
    )
    ahead = story.story_line(runs, [False, False, True, False], LABELS).split("\n\n")[0]
    assert ahead.startswith("At the one token of this answer that depends on the image, TR accepted more")


def test_token_drafts_name_the_first_child_offered_where_none_was_accepted():
    drafts = story.token_drafts(TR)
    assert [d.first for d in drafts] == [None, " blue", None, None]
    assert story.token_drafts(RECAP_MIXED)[4].this_request
