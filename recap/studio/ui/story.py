"""The paper's story in one line, above the Compare strip: what each method drafted at the tokens that
depend on the image, and where one method's draft was accepted and the other's was not.

Pure functions of step records and the sensitivity flags of the reference answer (AR's): no model,
no gradio. The counts are `recap.bench.sensitivity.split_against_reference`'s (the benchmark's rule: the
first token never counts, and a method counts only where its answer agrees with the reference).

Example (reference ``« The» «␣red» «␣circle»``, flags ``[F, T, T]``; TR drafted at both flagged tokens,
each at the first draft of a pass, and only «␣circle» was accepted; RECAP's ``ctx2`` node «␣red» was
accepted at a pass's first draft, then the bonus «␣circle»)::

    2 of the 2 tokens after the first depend on the image (the greedy token changes when the image is
    replaced by a blank one). Accepted drafts there (drafted there): RECAP 1 (1), Token Recycling 1 (2).
    On this input RECAP and Token Recycling accepted as many drafts there (1). Accepted there at a pass's
    first draft, where a tree offers its widest fan: Token Recycling 1 of 2, RECAP 1 of 1; after accepted
    drafts of the same pass, deeper in the tree: Token Recycling none met there, RECAP 0 of 1. RECAP's
    draft was accepted where Token Recycling's was not at «␣red» (from its contextual memory: «␣red»);
    Token Recycling's draft was accepted where RECAP's was not at «␣circle».
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

from recap.bench.sensitivity import (
    common_prefix,
    split_against_reference,
    token_ids,
    token_sources,
    token_texts,
)
from recap.studio.ui.explain import quote
from recap.trace import StepRecord

#: The memories whose records are conditioned on this request (its image and prompt).
CONTEXTUAL = frozenset({"ctx2", "ctx3"})

Outcome = Literal["accepted", "rejected", "none"]


class TokenDraft(NamedTuple):
    """What a method's drafter did at one committed token: ``accepted`` (a drafted node was it),
    ``rejected`` (the tree had children there, none of them was it) or ``none`` (nothing drafted
    there); ``sources``: the accepted node's sources (empty otherwise)."""

    outcome: Outcome
    sources: tuple[str, ...] = ()


def token_drafts(steps: Sequence[StepRecord]) -> list[TokenDraft]:
    """One `TokenDraft` per committed token of ``steps``, in order.

    Example: a step whose tree was ``root -> [a, b]`` that accepted ``a`` and then chose a bonus token
    under ``a`` (which has no child) gives ``[accepted, none]``; had it accepted nothing, the bonus
    token would be ``rejected`` (the root had children).
    """
    drafts: list[TokenDraft] = []
    for step in steps:
        parents = {node.parent for node in step.nodes}
        path = [-1, *step.accepted_ids]
        for i in range(len(step.new_tokens)):
            if i < len(step.accepted_ids) and 0 <= step.accepted_ids[i] < len(step.nodes):
                drafts.append(TokenDraft("accepted", tuple(step.nodes[step.accepted_ids[i]].sources)))
            else:
                at = path[min(i, len(path) - 1)]
                drafts.append(TokenDraft("rejected" if at in parents else "none"))
    return drafts


def story_line(
    runs: Mapping[str, Sequence[StepRecord]],
    flags: Sequence[bool],
    labels: Mapping[str, str],
    reference: str = "ar",
    replaced_by: str = "a blank one",
    coverage: Mapping[str, Sequence] | None = None,
) -> str:
    """The line (plain text). ``flags`` mark the image-dependent tokens of ``runs[reference]``'s answer;
    ``labels``: display names of the methods; ``coverage``: per method, what its memories held at each
    token (`recap.bench.coverage.PositionCoverage`, None for the first), for the methods that say."""
    base = runs[reference] if reference in runs else next(iter(runs.values()))
    ref_tokens = token_ids(base)
    texts = token_texts(base)
    counted = [i for i, flag in enumerate(flags[: len(ref_tokens)]) if flag and i > 0]
    head = (
        f"{len(counted)} of the {max(0, len(ref_tokens) - 1)} tokens after the first depend on the image "
        f"(the greedy token changes when the image is replaced by {replaced_by})."
    )
    if not counted:
        return head + " So no drafter can be told apart by the image here: try another example."
    parts, accepted = [], {}
    for method, steps in runs.items():
        if method == reference:
            continue
        tokens, drafts = token_ids(steps), token_drafts(steps)
        split = split_against_reference(tokens, token_sources(steps), ref_tokens, flags)
        agree = common_prefix(tokens, ref_tokens)
        drafted = sum(1 for i in counted if i < agree and drafts[i].outcome != "none")
        accepted[method] = split.sensitive_drafted
        parts.append(f"{labels.get(method, method)} {split.sensitive_drafted} ({drafted})")
    line = f"{head} Accepted drafts there (drafted there): {', '.join(parts)}."
    if "tr" in runs and "recap" in runs:
        line += " " + _verdict(accepted["tr"], accepted["recap"], labels)
    if coverage:
        line += " " + _held(runs, coverage, ref_tokens, counted, labels)
    if "tr" in runs and "recap" in runs:
        line += " " + _depths(runs["tr"], runs["recap"], ref_tokens, counted, labels)
        line += " " + _contrast(runs["tr"], runs["recap"], ref_tokens, texts, counted, labels)
    return line


def token_depths(steps: Sequence[StepRecord]) -> list[int]:
    """Per committed token of ``steps``, how many drafts its pass had accepted before it (0: the pass's
    first token, where the tree offers its whole fan of candidates)."""
    return [i for step in steps for i in range(len(step.new_tokens))]


def accepted_by_depth(
    steps: Sequence[StepRecord], positions: Sequence[int]
) -> tuple[tuple[int, int], tuple[int, int]]:
    """At ``positions`` (indices of committed tokens): ``(accepted, met)`` at a pass's first draft, then
    after accepted drafts of the same pass (deeper in the tree, where fewer candidates are left)."""
    depths, sources = token_depths(steps), token_sources(steps)
    groups = ([i for i in positions if depths[i] == 0], [i for i in positions if depths[i] > 0])
    first, deeper = ((sum(sources[i] != "target" for i in g), len(g)) for g in groups)
    return first, deeper


def _depths(tr, recap, ref_tokens, counted, labels) -> str:
    """Where each method met the image-dependent tokens, and how many it accepted there."""
    split = {}
    for method, steps in (("tr", tr), ("recap", recap)):
        agree = common_prefix(token_ids(steps), ref_tokens)
        split[method] = accepted_by_depth(steps, [i for i in counted if i < agree])
    tr_name, recap_name = labels.get("tr", "tr"), labels.get("recap", "recap")
    (tr_first, tr_deeper), (recap_first, recap_deeper) = split["tr"], split["recap"]
    return (
        f"Accepted there at a pass's first draft, where a tree offers its widest fan: {tr_name} "
        f"{_of(tr_first)}, {recap_name} {_of(recap_first)}; after accepted drafts of the same pass, "
        f"deeper in the tree: {tr_name} {_of(tr_deeper)}, {recap_name} {_of(recap_deeper)}."
    )


def _of(counts: tuple[int, int]) -> str:
    """``(accepted, met)`` in words: "1 of 2", or "none met there" (not "0 of 0")."""
    accepted, met = counts
    return f"{accepted} of {met}" if met else "none met there"


def _held(runs, coverage, ref_tokens, counted, labels) -> str:
    """Whether the memories already held the image-dependent tokens (information), and how many of
    them were first mentions (the two tokens before never committed earlier in the answer)."""
    parts, first = [], None
    for method, positions in coverage.items():
        agree = common_prefix(token_ids(runs[method]), ref_tokens)
        here = [positions[i] for i in counted if i < min(agree, len(positions)) and positions[i] is not None]
        if not here:
            continue
        held = sum(bool(p.sources) for p in here)
        own = sum(p.this_request for p in here)
        name = labels.get(method, method)
        mine = f" ({own} from this image's own records)" if own else ""
        parts.append(f"{name} {held} of {len(here)}{mine}")
        if first is None:
            first, total = sum(p.first_mention for p in here), len(here)
    if not parts:
        return ""
    if total == 1:
        mentions = f"that token was {'a' if first else 'not a'} first mention"
    else:
        mentions = f"{'all' if first == total else f'{first} of'} {total} were first mentions"
    return (
        f"A memory already held the token there: {', '.join(parts)}; {mentions} (the answer had not yet "
        "said the two tokens before it)."
    )


def _verdict(tr: int, recap: int, labels) -> str:
    """Who accepted more drafts at the image-dependent tokens of this input, said before any example."""
    tr_name, recap_name = labels.get("tr", "tr"), labels.get("recap", "recap")
    if tr == recap:
        return f"On this input {recap_name} and {tr_name} accepted as many drafts there ({tr})."
    more, fewer = (recap_name, tr_name) if recap > tr else (tr_name, recap_name)
    counts = f"{max(tr, recap)} against {min(tr, recap)}"
    return f"On this input {more} accepted more drafts there than {fewer} ({counts})."


def _contrast(tr, recap, ref_tokens, texts, counted, labels) -> str:
    """Name the image-dependent tokens where one method's draft was accepted and the other's was not
    (rejected, or nothing drafted), and which of RECAP's came from its contextual memories: the two
    lists differ by the difference of the counts."""
    tr_drafts, recap_drafts = token_drafts(tr), token_drafts(recap)
    agree = min(common_prefix(token_ids(tr), ref_tokens), common_prefix(token_ids(recap), ref_tokens))
    here = [i for i in counted if i < agree]
    won = [i for i in here if recap_drafts[i].outcome == "accepted" and tr_drafts[i].outcome != "accepted"]
    lost = [i for i in here if tr_drafts[i].outcome == "accepted" and recap_drafts[i].outcome != "accepted"]
    tr_name, recap_name = labels.get("tr", "tr"), labels.get("recap", "recap")
    if not (won or lost):
        if any(tr_drafts[i].outcome == "accepted" for i in here):
            return f"{tr_name} and {recap_name} accepted drafts at the same ones."
        return f"Neither {tr_name} nor {recap_name} accepted a draft at any of them."
    parts = []
    if won:
        contextual = [i for i in won if CONTEXTUAL.intersection(recap_drafts[i].sources)]
        mine = f" (from its contextual memory: {_named(contextual, texts)})" if contextual else ""
        parts.append(
            f"{recap_name}'s draft was accepted where {tr_name}'s was not at {_named(won, texts)}{mine}"
        )
    if lost:
        parts.append(f"{tr_name}'s draft was accepted where {recap_name}'s was not at {_named(lost, texts)}")
    return "; ".join(parts) + "."


def _named(positions, texts) -> str:
    return ", ".join(quote(texts[i]) for i in positions)


def story_html(line: str) -> str:
    """The line as the HTML above the strip (escaped once)."""
    return f'<p class="recap-story">{html.escape(line, quote=False)}</p>'
