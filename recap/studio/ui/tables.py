"""The step panel's table and the Sensitivity tab's: `StepRecord`s in, ``gr.Dataframe`` rows out
(``list[list]`` under the ``*_HEADERS`` list). Plain value transformations, unit-tested without a
browser, like `recap.studio.ui.render`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from recap.bench.sensitivity import common_prefix, split_against_reference, token_ids, token_sources
from recap.studio.ui.drawing import listed
from recap.studio.ui.render import method_label
from recap.studio.ui.story import accepted_by_depth
from recap.trace import StepRecord

STEP_TABLE_HEADERS = ["quantity", "value"]
SENSITIVITY_HEADERS = [
    "method",
    "accepted drafts at image-sensitive tokens",
    "accepted drafts at insensitive tokens",
    "a memory held it (image-sensitive; of them from this image)",
    "image-sensitive, accepted / reached: at a pass's first draft · deeper in the tree",
]


# ---------------------------------------------------------------------------------- step table
def step_table(step: StepRecord) -> list[list]:
    """Rows ``[quantity, value]`` describing one step (under `STEP_TABLE_HEADERS`)."""
    timing = step.timing or {}
    sources = listed(sorted({s for n in step.nodes for s in n.sources}))
    return [
        ["step", step.step],
        ["method", method_label(step.method)],
        ["tokens before this pass (prompt + answer)", step.committed_len],
        ["nodes drafted", len(step.nodes)],
        ["drafting sources", ", ".join(sources) or "none"],
        ["accepted drafted tokens", step.accepted_len],
        ["tokens committed", len(step.new_tokens)],
        ["draft ms (wall)", round(timing.get("draft_ms", 0.0), 2)],
        ["verify ms (wall)", round(timing.get("verify_ms", 0.0), 2)],
        ["update ms (wall)", round(timing.get("update_ms", 0.0), 2)],
        ["draft + update CPU ms", round(step.drafter_cpu_ms, 2)],
    ]


# ---------------------------------------------------------------------------------- sensitivity
def sensitivity_rows(
    runs: Mapping[str, Sequence[StepRecord]],
    flags: Sequence[bool],
    coverage: Mapping[str, Sequence] | None = None,
) -> list[list]:
    """Per method: tokens from accepted drafts / all tokens at image-sensitive and insensitive positions
    (not the first), and where ``coverage`` says (the Compare tab's probe, `recap.bench.coverage`): at
    how many image-sensitive positions a memory already held the token, and how many of those a record
    of this request (this image); then the image-sensitive ones split by where the method met them (a
    pass's first draft, or deeper: `recap.studio.ui.story.accepted_by_depth`).

    ``flags`` mark the positions of the first run's answer (the reference the sensitivity pass
    forced); a method is counted only where its answer agrees with it (`split_against_reference`).
    """
    if not runs:
        return []
    reference = token_ids(next(iter(runs.values())))
    rows = []
    for method, steps in runs.items():
        tokens = token_ids(steps)
        split = split_against_reference(tokens, token_sources(steps), reference, flags)
        rows.append(
            [
                method_label(method),
                _rate(split.sensitive_drafted, split.sensitive_total),
                _rate(split.insensitive_drafted, split.insensitive_total),
                _held((coverage or {}).get(method), flags, common_prefix(tokens, reference)),
                _by_depth(steps, flags, common_prefix(tokens, reference)),
            ]
        )
    return rows


def _by_depth(steps: Sequence[StepRecord], flags: Sequence[bool], agree: int) -> str:
    """``accepted/met`` at the image-sensitive positions met at a pass's first draft, then deeper (after
    accepted drafts of the same pass, where a tree has fewer candidates left)."""
    counted = [i for i, flag in enumerate(flags[:agree]) if flag and i > 0]
    return " · ".join(f"{won}/{met}" for won, met in accepted_by_depth(steps, counted))


def _held(positions: Sequence | None, flags: Sequence[bool], agree: int) -> str:
    """``held/total (of them from this image)`` at the image-sensitive positions, or ``-``."""
    if not positions:
        return "-"
    here = [p for p, f in zip(positions[:agree], flags[:agree]) if f and p is not None]
    held = [p for p in here if p.sources]
    own = sum(p.this_request for p in held)
    return f"{_rate(len(held), len(here))}; {own} from this image" if here else "0/0 (-)"


def _rate(drafted: int, total: int) -> str:
    return f"{drafted}/{total} ({100 * drafted / total:.0f}%)" if total else "0/0 (-)"
