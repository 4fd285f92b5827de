"""One step of decoding in plain words: what a teacher reads aloud beside the tree.

`explain_step` turns a `StepRecord` into two or three sentences: how many nodes each memory proposed,
the accepted path, where the first rejection happened (what the draft said, with its fused
probability when the drafter has one, and what the target chose instead), and the bonus token.
Plain text (no markup): the studio escapes it like any other text.

Example (a step whose tree held "red" (ctx3) and "blue" (persistent) under the root, and whose
target chose "red" and then " circle")::

    Step 4: the drafter proposed 2 nodes (ctx3 1, persistent 1). The target accepted 1: «red».
    After it the draft ended; the target added the bonus token «circle». 2 tokens in this pass.
"""

from __future__ import annotations

from collections import Counter

from recap.drafters.recap.fusion import MEMORIES
from recap.studio.ui.drawing import MAX_NAMES, NAME_CHARS, TEXT_CHARS, cut
from recap.trace import NodeRecord, StepRecord
from recap.tree import SOURCES

#: Sources that are memories with a fused distribution (their nodes have a fused probability).
_FUSED_SOURCES = frozenset(MEMORIES)


def quote(text: str) -> str:
    """A token's text between «» as a reader says it: its leading and trailing spaces left out (a
    token of spaces only shows ␣; line breaks ↵, tabs ⇥), cut to `recap.studio.ui.drawing.TEXT_CHARS`.
    The space markers and token ids are for the figures' tooltips."""
    shown = text.strip() or text.replace(" ", "␣")
    return "«" + cut(shown, TEXT_CHARS).replace("\n", "↵").replace("\t", "⇥") + "»"


def explain_step(step: StepRecord) -> str:
    """Two or three plain sentences about one pass (see the module docstring)."""
    if step.step == 0:
        first = quote(step.new_texts[0]) if step.new_texts else "the first token"
        return (
            f"Step 0 is the prefill: the target read the image and the prompt in one pass and chose "
            f"{first} itself. Nothing can be drafted before the first token exists."
        )
    head = f"Step {step.step}: "
    nodes = step.nodes
    if not nodes:
        why = _nothing_drafted(step.method)
        if len(step.new_texts) != 1:  # a replayed trace can hold a step with no token, or several
            return head + f"{why}; this step's record holds {_count(len(step.new_texts), 'token')}."
        text = _texts(step.new_texts)
        return head + f"{why}, so the pass produced one token, {text}, as plain decoding does."
    sentences = [head + f"the drafter proposed {_count(len(nodes), 'node')} ({_by_source(nodes)})."]
    accepted = [n for n in step.accepted_ids if 0 <= n < len(nodes)]
    accepted_texts = [nodes[n].text for n in accepted]
    if accepted:
        sentences.append(f"The target accepted {len(accepted)}: {_texts(accepted_texts)}.")
    else:
        sentences.append(
            "The target rejected it." if len(nodes) == 1 else "The target accepted none of them."
        )
    sentences.append(_after(step, accepted))
    if fanned := [n for n in nodes if n.fan]:
        contexts = _count(len({n.parent for n in fanned}), "context")
        sentences.append(
            f"Fans: at {contexts} where earlier answers (under other images) went on in different ways, "
            f"the best candidate and the words those answers chose ({_count(len(fanned), 'node')}) were "
            "offered together."
        )
    if left_out := _left_out(step):
        sentences.append(left_out)
    total = len(step.new_tokens)
    sentences.append(f"{_count(total, 'token')} in this pass.")
    if step.finished:
        sentences.append(_finish(step.finish_reason))
    return " ".join(sentences)


#: Why a method drafted nothing at a pass, by method (RECAP and its ablations: `_nothing_drafted`).
_NOTHING = {
    "ar": "autoregressive decoding drafts nothing",
    "pld": "prompt lookup found no earlier occurrence of the last tokens to copy from",
    "tr": "Token Recycling's matrix held no successors of the last token",
    "suffix": "SuffixDecoding's suffix trees held no continuation of this context",
}


def _nothing_drafted(method: str) -> str:
    """Why ``method``'s pass drafted nothing, in words."""
    return _NOTHING.get(method, "the drafter proposed nothing (no memory knew this context)")


def _after(step: StepRecord, accepted: list[int]) -> str:
    """Where the walk stopped: the first rejection (draft vs target), or the end of the tree."""
    nodes = step.nodes
    parent = accepted[-1] if accepted else -1
    children = [n for n in nodes if n.parent == parent]
    where = "After it" if accepted else "At the first position"
    if step.bonus_token is None:  # cut by the end of sequence or the length limit
        return f"{where} the run stopped before a bonus token."
    bonus = quote(step.new_texts[-1]) if step.new_texts else "a token"
    if not children:
        return f"{where} the draft ended; the target added the bonus token {bonus}."
    best = max(children, key=lambda n: (n.score, -n.id))
    said = f"the draft said {quote(best.text)}"
    probability = _fused_probability(best)
    if probability is not None:
        said += f" (fused probability {probability:.2f})"
    others = len(children) - 1
    if others:
        said += f" and {_count(others, 'other option')}"
    return f"{where} {said}; the target chose {bonus}, which became the bonus token."


def _left_out(step: StepRecord) -> str:
    """Why a token the fused distribution ranks above a drafted first candidate is not in the tree ("" if
    none is): the search orders candidates by their learnt acceptance estimates."""
    first = {n.token for n in step.nodes if n.parent == -1}
    drafted = [f for f in step.fused_at_root if f.token in first]
    if not drafted:
        return ""
    least = min(drafted, key=lambda f: f.prob)
    # (shown to 2 decimals: a gap under 0.005 would read as "0.30 is higher than 0.30")
    skipped = [f for f in step.fused_at_root if f.token not in first and f.prob >= least.prob + 0.005]
    if not skipped:
        return ""
    top = max(skipped, key=lambda f: f.prob)
    more = f" (and {_count(len(skipped) - 1, 'other')})" if len(skipped) > 1 else ""
    return (
        f"{quote(top.text)}{more} was not drafted first though its fused probability ({top.prob:.2f}) is "
        f"higher than the drafted {quote(least.text)}'s ({least.prob:.2f}): the tree orders candidates by "
        "how often such candidates were accepted before (learnt acceptance estimates), not by fused "
        "probability."
    )


def _fused_probability(node: NodeRecord) -> float | None:
    """A memory node's fused probability given its parent (its sources' shares add up to it)."""
    if not _FUSED_SOURCES.intersection(node.contributions):
        return None
    return float(sum(node.contributions.values()))


def _by_source(nodes: list[NodeRecord]) -> str:
    counts: Counter = Counter(source for node in nodes for source in node.sources)
    ordered = sorted(counts, key=lambda s: (SOURCES.index(s) if s in SOURCES else len(SOURCES), s))
    parts = ", ".join(f"{cut(source, NAME_CHARS)} {counts[source]}" for source in ordered[:MAX_NAMES])
    if len(ordered) > MAX_NAMES:  # (a replayed trace's node may name thousands)
        parts += f", and {_count(len(ordered) - MAX_NAMES, 'other source')}"
    shared = sum(len(node.sources) > 1 for node in nodes)
    if shared:
        parts += f"; {_count(shared, 'node')} proposed by several"
    return parts


def _texts(texts: list[str]) -> str:
    """The texts quoted, at most `MAX_NAMES` x 4 of them (then how many more)."""
    if not texts:
        return "nothing"
    limit = 4 * MAX_NAMES
    more = f" and {len(texts) - limit} more" if len(texts) > limit else ""
    return " ".join(quote(t) for t in texts[:limit]) + more


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _finish(reason: str | None) -> str:
    if reason == "eos":
        return "The target ended the answer here."
    return "The run reached its token limit here."
