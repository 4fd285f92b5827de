"""The paper's story above the Compare strip: at most two sentences on the tokens that depend on the
image (who accepted more drafts there, and at one token why), then every count, folded.

Pure functions of step records and the sensitivity flags of the reference answer (AR's): no model,
no gradio. The counts are `recap.bench.sensitivity.split_against_reference`'s (the benchmark's rule: the
first token never counts, and a method counts only where its answer agrees with the reference).

Example (reference ``« The» «␣red» «␣circle»``, flags ``[F, T, T]``; TR drafted at both flagged tokens,
each at the first draft of a pass: «␣blue» (rejected) then «␣circle» (accepted); RECAP's ``ctx2`` node
«␣red» was accepted at a pass's first draft, then the bonus «␣circle»)::

    At the 2 tokens of this answer that depend on the image, RECAP accepted more drafts than Token
    Recycling (2 against 1). At «red», Token Recycling looked up the last token «The» alone and drafted
    «blue»; RECAP's draft came from its 2-token key.

    2 of the 2 tokens after the first depend on the image (the greedy token changes when the image is
    replaced by a blank one). Accepted drafts there (drafted there): RECAP 2 (2), Token Recycling 1 (2).
    ... RECAP's draft was accepted where Token Recycling's was not at «red» (from its contextual
    memory: «red»).

The headline and the details are one text, split at the first blank line (`story_html` folds the
details into a ``<details>`` element).
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
    there); ``sources``: the accepted node's sources (empty otherwise); ``first``: where it was not
    accepted, the text of the first child the tree offered there (None: none); ``this_request``: the
    accepted node came from a record this request wrote (under its image)."""

    outcome: Outcome
    sources: tuple[str, ...] = ()
    first: str | None = None
    this_request: bool = False


def token_drafts(steps: Sequence[StepRecord]) -> list[TokenDraft]:
    """One `TokenDraft` per committed token of ``steps``, in order.

    Example: a step whose tree was ``root -> [a, b]`` that accepted ``a`` and then chose a bonus token
    under ``a`` (which has no child) gives ``[accepted, none]``; had it accepted nothing, the bonus
    token would be ``rejected`` (the root had children; ``first`` is ``a``'s text).
    """
    drafts: list[TokenDraft] = []
    for step in steps:
        children: dict[int, list[str]] = {}
        for node in step.nodes:
            children.setdefault(node.parent, []).append(node.text)
        path = [-1, *step.accepted_ids]
        for i in range(len(step.new_tokens)):
            if i < len(step.accepted_ids) and 0 <= step.accepted_ids[i] < len(step.nodes):
                node = step.nodes[step.accepted_ids[i]]
                drafts.append(TokenDraft("accepted", tuple(node.sources), this_request=node.this_request))
            else:
                offered = children.get(path[min(i, len(path) - 1)])
                drafts.append(TokenDraft("rejected", first=offered[0]) if offered else TokenDraft("none"))
    return drafts


def story_line(
    runs: Mapping[str, Sequence[StepRecord]],
    flags: Sequence[bool],
    labels: Mapping[str, str],
    reference: str = "ar",
    replaced_by: str = "a blank one",
    coverage: Mapping[str, Sequence] | None = None,
) -> str:
    """The story (plain text): a headline of at most two sentences, a blank line, then every count.
    ``flags`` mark the image-dependent tokens of ``runs[reference]``'s answer; ``labels``: display names
    of the methods; ``coverage``: per method, what its memories held at each token
    (`recap.bench.coverage.PositionCoverage`, None for the first), for the methods that say."""
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
    if coverage:
        line += " " + _held(runs, coverage, ref_tokens, counted, labels)
    if "tr" in runs and "recap" in runs:
        line += " " + _depths(runs["tr"], runs["recap"], ref_tokens, counted, labels)
        line += " " + _contrast(runs["tr"], runs["recap"], ref_tokens, texts, counted, labels)
        return f"{_headline(runs, accepted, ref_tokens, texts, counted, labels)}\n\n{line}"
    return line


def _headline(runs, accepted, ref_tokens, texts, counted, labels) -> str:
    """At most two sentences: who accepted more drafts at the image-dependent tokens, then at one token
    where RECAP's draft was accepted and TR's was not, what TR's last-token key offered and where
    RECAP's draft came from ("" for the second where there is no such token)."""
    tr_name, recap_name = labels.get("tr", "tr"), labels.get("recap", "recap")
    tr, recap = accepted["tr"], accepted["recap"]
    where = (
        "At the one token of this answer that depends on the image"
        if len(counted) == 1
        else f"At the {len(counted)} tokens of this answer that depend on the image"
    )
    if tr == recap:
        first = f"{where}, {recap_name} and {tr_name} accepted as many drafts ({tr})."
    else:
        more, fewer = (recap_name, tr_name) if recap > tr else (tr_name, recap_name)
        counts = f"{max(tr, recap)} against {min(tr, recap)}"
        first = f"{where}, {more} accepted more drafts than {fewer} ({counts})."
    if recap > tr:
        second = _why(runs["tr"], runs["recap"], ref_tokens, texts, counted, tr_name, recap_name)
    else:  # where TR is level or ahead, the tokens it won come first: no single token is picked
        second = _sides(runs["tr"], runs["recap"], ref_tokens, texts, counted, tr_name, recap_name)
    return f"{first} {second}" if second else first


def _sides(tr, recap, ref_tokens, texts, counted, tr_name, recap_name) -> str:
    """The tokens where TR's draft was accepted and RECAP's was not, then the other way round, as one
    sentence ("" where both accepted drafts at the same tokens)."""
    won, lost = _won_lost(tr, recap, ref_tokens, counted)
    parts = []
    if lost:
        parts.append(f"{tr_name}'s draft was accepted where {recap_name}'s was not at {_named(lost, texts)}")
    if won:
        parts.append(f"{recap_name}'s where {tr_name}'s was not at {_named(won, texts)}")
    return "; ".join(parts) + "." if parts else ""


def _won_lost(tr, recap, ref_tokens, counted) -> tuple[list[int], list[int]]:
    """The image-dependent tokens (where both answers still agree with the reference) at which RECAP's
    draft was accepted and TR's was not, and those the other way round."""
    tr_drafts, recap_drafts = token_drafts(tr), token_drafts(recap)
    agree = min(common_prefix(token_ids(tr), ref_tokens), common_prefix(token_ids(recap), ref_tokens))
    here = [i for i in counted if i < agree]
    won = [i for i in here if recap_drafts[i].outcome == "accepted" and tr_drafts[i].outcome != "accepted"]
    lost = [i for i in here if tr_drafts[i].outcome == "accepted" and recap_drafts[i].outcome != "accepted"]
    return won, lost


def _why(tr, recap, ref_tokens, texts, counted, tr_name, recap_name) -> str:
    """One sentence on the clearest token where RECAP's draft was accepted and TR's was not: TR's draft
    there came from the last token alone (and, where it did, from what followed that token earlier in
    this answer, another context); RECAP's from a 2- or 3-token key (and whether this request wrote it,
    under this image). Tokens that show both come first."""
    tr_drafts, recap_drafts = token_drafts(tr), token_drafts(recap)
    won = _won_lost(tr, recap, ref_tokens, counted)[0]
    if not won:
        return ""

    def earlier(i: int) -> bool:  # TR's first draft is what followed the same last token earlier here
        return any(texts[j - 1] == texts[i - 1] and texts[j] == tr_drafts[i].first for j in range(1, i))

    def clearness(i: int) -> tuple[bool, bool, bool]:
        draft = recap_drafts[i]
        return (bool(CONTEXTUAL.intersection(draft.sources)) and draft.this_request, earlier(i), True)

    i = max(won, key=clearness)  # (the first of the clearest)
    offered = tr_drafts[i].first
    tr_part = f"drafted {quote(offered)}" if offered is not None else "drafted nothing there"
    if offered is not None and earlier(i):
        tr_part += f", what followed {quote(texts[i - 1])} earlier in this answer"
    sources = recap_drafts[i].sources
    length = 3 if "ctx3" in sources else 2 if "ctx2" in sources else 0
    if length:
        key = f" {quote(''.join(texts[i - length : i]))}" if i >= length else ""
        recap_part = f"its {length}-token key{key}"
        if recap_drafts[i].this_request:
            recap_part += ", recorded under this image in this request"
    else:
        recap_part = f"its {', '.join(sources) or 'tree'}"
    return (
        f"At {quote(texts[i])}, {tr_name} looked up the last token {quote(texts[i - 1])} alone and "
        f"{tr_part}; {recap_name}'s draft came from {recap_part}."
    )


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


def _contrast(tr, recap, ref_tokens, texts, counted, labels) -> str:
    """Name the image-dependent tokens where one method's draft was accepted and the other's was not
    (rejected, or nothing drafted), and which of RECAP's came from its contextual memories: the two
    lists differ by the difference of the counts."""
    tr_drafts, recap_drafts = token_drafts(tr), token_drafts(recap)
    agree = min(common_prefix(token_ids(tr), ref_tokens), common_prefix(token_ids(recap), ref_tokens))
    here = [i for i in counted if i < agree]
    won, lost = _won_lost(tr, recap, ref_tokens, counted)
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


#: What the folded details of the story are called on the page.
DETAILS = "Every count, token by token"


def story_html(line: str) -> str:
    """The story as the HTML above the strip (escaped once): its headline (up to the first blank line)
    as a paragraph, the rest folded in a ``<details>`` element."""
    headline, _, details = line.partition("\n\n")
    shown = f'<p class="recap-story">{html.escape(headline, quote=False)}</p>'
    if details:
        shown += (
            f'<details class="recap-story-details"><summary>{DETAILS}</summary>'
            f"<p>{html.escape(details, quote=False)}</p></details>"
        )
    return shown
