"""`explain_step` against hand-checked steps (each expected sentence was read against its tree)."""

from __future__ import annotations

import pytest

from recap.studio.ui.explain import explain_step, quote
from recap.trace import NodeRecord, StepRecord


def node(i, parent, text, sources, share=None, score=0.5, accepted=False):
    contributions = {s: share / len(sources) for s in sources} if share is not None else {}
    return NodeRecord(i, parent, 100 + i, text, 1, score, list(sources), contributions, accepted)


def test_prefill_step():
    step = StepRecord(step=0, committed_len=12, method="recap", new_tokens=[5], new_texts=["The"])
    assert explain_step(step) == (
        "Step 0 is the prefill: the target read the image and the prompt in one pass and chose «The» "
        "itself. Nothing can be drafted before the first token exists."
    )


@pytest.mark.parametrize(
    ("method", "why"),
    [
        ("recap", "the drafter proposed nothing (no memory knew this context)"),
        ("recap-no-context", "the drafter proposed nothing (no memory knew this context)"),
        ("ar", "autoregressive decoding drafts nothing"),  # AR has neither a drafter nor a memory
        ("pld", "prompt lookup found no earlier occurrence of the last tokens to copy from"),
        ("tr", "Token Recycling's matrix held no successors of the last token"),
        ("suffix", "SuffixDecoding's suffix trees held no continuation of this context"),
    ],
)
def test_nothing_drafted_says_why_for_each_method(method, why):
    step = StepRecord(step=3, committed_len=20, method=method, new_tokens=[9], new_texts=[" a"])
    step.bonus_token = 9
    expected = f"Step 3: {why}, so the pass produced one token, «a», as plain decoding does."
    assert explain_step(step) == expected


def test_a_replayed_step_without_its_token_is_not_narrated_as_one():
    # a trace file can hold a step with no token (or several) and no tree: the words say what it holds
    for texts in ([], [" a", " b"]):
        step = StepRecord(step=3, committed_len=20, method="tr", new_texts=texts)
        words = explain_step(step)
        assert "one token" not in words and f"this step's record holds {len(texts)} tokens" in words


def test_a_single_rejected_node_is_it_not_them():
    step = StepRecord(
        step=2, committed_len=20, method="tr", nodes=[node(0, -1, " red", ["template"])], bonus_token=9,
        new_tokens=[9], new_texts=[" blue"],
    )  # fmt: skip
    assert "the drafter proposed 1 node (template 1). The target rejected it." in explain_step(step)


def test_the_module_docstring_example():
    # root -> [red (ctx3), blue (persistent)]; target chose "red" then " circle".
    nodes = [node(0, -1, "red", ["ctx3"], 0.6, 0.6, True), node(1, -1, "blue", ["persistent"], 0.3, 0.3)]
    step = StepRecord(
        step=4,
        committed_len=30,
        method="recap",
        nodes=nodes,
        accepted_ids=[0],
        bonus_token=7,
        new_tokens=[100, 7],
        new_texts=["red", " circle"],
    )
    assert explain_step(step) == (
        "Step 4: the drafter proposed 2 nodes (ctx3 1, persistent 1). The target accepted 1: «red». "
        "After it the draft ended; the target added the bonus token «circle». 2 tokens in this pass."
    )


def test_first_rejection_names_the_draft_its_fused_probability_and_the_targets_choice():
    # root -> the -> [ red (ctx2+persistent, 0.7), blue (persistent, 0.2) ]; target: "the" then "green".
    nodes = [
        node(0, -1, " the", ["ctx3"], 0.9, 0.9, True),
        node(1, 0, " red", ["ctx2", "persistent"], 0.7, 0.63),
        node(2, 0, " blue", ["persistent"], 0.2, 0.18),
    ]
    step = StepRecord(
        step=7,
        committed_len=40,
        method="recap",
        nodes=nodes,
        accepted_ids=[0],
        bonus_token=55,
        new_tokens=[100, 55],
        new_texts=[" the", " green"],
    )
    assert explain_step(step) == (
        "Step 7: the drafter proposed 3 nodes (ctx3 1, ctx2 1, persistent 2; 1 node proposed by "
        "several). The target accepted 1: «the». After it the draft said «red» (fused probability "
        "0.70) and 1 other option; the target chose «green», which became the bonus token. "
        "2 tokens in this pass."
    )


def test_rejection_at_the_root_of_a_template_tree_has_no_fused_probability():
    nodes = [node(0, -1, "cat", ["template"], score=0.0), node(1, 0, "s", ["template"], score=0.0)]
    step = StepRecord(
        step=2,
        committed_len=9,
        method="tr",
        nodes=nodes,
        accepted_ids=[],
        bonus_token=3,
        new_tokens=[3],
        new_texts=["dog"],
    )
    assert explain_step(step) == (
        "Step 2: the drafter proposed 2 nodes (template 2). The target accepted none of them. "
        "At the first position the draft said «cat»; the target chose «dog», which became the bonus "
        "token. 1 token in this pass."
    )


def test_end_of_sequence_inside_the_accepted_path():
    nodes = [node(0, -1, ".", ["suffix"], score=1.0, accepted=True), node(1, 0, "</s>", ["suffix"], 1.0)]
    step = StepRecord(
        step=9,
        committed_len=50,
        method="recap",
        nodes=nodes,
        accepted_ids=[0, 1],
        bonus_token=None,
        new_tokens=[100, 101],
        new_texts=[".", "</s>"],
        finished=True,
        finish_reason="eos",
    )
    assert explain_step(step) == (
        "Step 9: the drafter proposed 2 nodes (suffix 2). The target accepted 2: «.» «</s>». After it "
        "the run stopped before a bonus token. 2 tokens in this pass. The target ended the answer here."
    )


def test_quote_makes_whitespace_visible():
    assert quote(" a\n\tb") == "«a↵⇥b»" and quote("  ") == "«␣␣»"


def test_a_likelier_candidate_left_out_of_the_tree_is_named_with_why():
    # the fused distribution at the root ranks «grey» above the drafted «lime»; the search did not draft
    # it (its acceptance estimate was lower): the paragraph says so, once the tree is read
    from recap.trace import FusedRecord

    nodes = [node(0, -1, " red", ["ctx3"], 0.5, 0.5, True), node(1, -1, " lime", ["persistent"], 0.07, 0.3)]
    fused = [
        FusedRecord(100, " red", 0.5, {"ctx3": 0.5}),
        FusedRecord(7, " grey", 0.1, {"ctx2": 0.1}),
        FusedRecord(8, " black", 0.08, {"ctx2": 0.08}),
        FusedRecord(101, " lime", 0.07, {"persistent": 0.07}),
        FusedRecord(9, " pink", 0.01, {"ctx2": 0.01}),
    ]
    step = StepRecord(
        step=5, committed_len=30, method="recap", nodes=nodes, accepted_ids=[0], bonus_token=3,
        new_tokens=[100, 3], new_texts=[" red", " circle"], fused_at_root=fused,
    )  # fmt: skip
    text = explain_step(step)
    assert (
        "«grey» (and 1 other) was not drafted first though its fused probability (0.10) is higher than "
        "the drafted «lime»'s (0.07): the tree orders candidates by how often such candidates were "
        "accepted before (learnt acceptance estimates), not by fused probability." in text
    )
    fused[1:3] = [FusedRecord(7, " grey", 0.073, {"ctx2": 0.073})]  # as likely, to 2 decimals: no sentence
    assert "was not drafted first" not in explain_step(step)


def test_nodes_offered_in_a_fan_are_said_so():
    # root -> [red, blue]: earlier answers went on 3 ways after the root's context; red -> circle.
    nodes = [
        node(0, -1, "red", ["ctx2"], 0.4, 0.4, True),
        node(1, -1, "blue", ["ctx2"], 0.3, 0.3),
        node(2, 0, " circle", ["ctx3"], 0.9, 0.36, True),
    ]
    nodes[0].fan = nodes[1].fan = 3
    step = StepRecord(
        step=2,
        committed_len=20,
        method="recap",
        nodes=nodes,
        accepted_ids=[0, 2],
        bonus_token=9,
        new_tokens=[100, 101, 9],
        new_texts=["red", " circle", " at"],
    )
    assert (
        "Fans: at 1 context where earlier answers (under other images) went on in different ways, the "
        "best candidate and the words those answers chose (2 nodes) were offered together."
    ) in explain_step(step)
    nodes[0].fan = nodes[1].fan = 0
    assert "Fans" not in explain_step(step)
