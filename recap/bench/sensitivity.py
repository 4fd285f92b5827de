"""Image-sensitive decoding states (the paper's diagnosis), shared by the studio and the benchmark.

A generated position is *image-sensitive* when the target's greedy token there changes if the image is
replaced by another one: one teacher-forced pass over the same answer with the other image. For each
method we then ask how often the token at a sensitive (or insensitive) position came from an accepted
draft rather than from the target's own bonus token.

Example: answer ``[5, 8, 2]``, greedy under another image ``[5, 9, 2]`` -> flags ``[F, T, F]``; if a
method drafted tokens 1 and 2 (``sources = [target, ctx2, ctx3]``), its acceptance is 1/1 at sensitive
positions and 1/2 at insensitive ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image

from recap.models import TargetModel
from recap.trace import StepRecord


def sensitive_flags(
    target: TargetModel, other_images: Sequence[Image.Image], prompt: str, answer: Sequence[int]
) -> list[bool]:
    """For each answer token: does the target's greedy prediction there change under ``other_images``?"""
    greedy = target.teacher_forced_greedy(other_images, prompt, answer)
    return [int(g) != int(a) for g, a in zip(greedy, answer)]


def token_ids(steps: Sequence[StepRecord]) -> list[int]:
    """Every generated token, in order (the answer's ids)."""
    return [token for step in steps for token in step.new_tokens]


def token_texts(steps: Sequence[StepRecord]) -> list[str]:
    """The text of every generated token, in order (joined: the answer as shown)."""
    return [text for step in steps for text in step.new_texts]


def token_sources(steps: Sequence[StepRecord]) -> list[str]:
    """The source of every generated token, in order (``target`` = produced by the target itself)."""
    return [source for step in steps for source in step.new_sources]


@dataclass(frozen=True)
class SensitivitySplit:
    """Drafted-and-accepted counts at sensitive and insensitive positions."""

    sensitive_drafted: int
    sensitive_total: int
    insensitive_drafted: int
    insensitive_total: int

    @property
    def sensitive_rate(self) -> float | None:
        return self.sensitive_drafted / self.sensitive_total if self.sensitive_total else None

    @property
    def insensitive_rate(self) -> float | None:
        return self.insensitive_drafted / self.insensitive_total if self.insensitive_total else None

    def __add__(self, other: SensitivitySplit) -> SensitivitySplit:
        return SensitivitySplit(
            self.sensitive_drafted + other.sensitive_drafted,
            self.sensitive_total + other.sensitive_total,
            self.insensitive_drafted + other.insensitive_drafted,
            self.insensitive_total + other.insensitive_total,
        )


def acceptance_split(sources: Sequence[str], flags: Sequence[bool]) -> SensitivitySplit:
    """Count drafted tokens (source != ``target``) at sensitive / insensitive positions.

    The first generated token always comes from the prefill pass (no draft is possible there), so it is
    left out of both counts.
    """
    counts = [0, 0, 0, 0]
    for source, sensitive in list(zip(sources, flags))[1:]:
        base = 0 if sensitive else 2
        counts[base] += source != "target"
        counts[base + 1] += 1
    return SensitivitySplit(*counts)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def split_against_reference(
    tokens: Sequence[int], sources: Sequence[str], reference: Sequence[int], flags: Sequence[bool]
) -> SensitivitySplit:
    """A method's acceptance split, counted only where its output agrees with ``reference``.

    ``flags`` mark the positions of ``reference`` (the answer the sensitivity pass forced through the
    target); past the first token where a method's output differs from it, its positions are not the
    reference's, so they are left out. The benchmark and the studio both split this way.

    Example: reference ``[5, 8, 2]``, flags ``[F, T, F]``; a method wrote ``[5, 8, 3]`` with sources
    ``[target, ctx2, ctx3]`` -> only the first two positions count: 1/1 drafted at sensitive positions,
    0/0 at insensitive ones (the first token never counts).
    """
    agree = common_prefix(tokens, reference)
    return acceptance_split(list(sources)[:agree], list(flags)[:agree])


def mark_steps(steps: Sequence[StepRecord], flags: Sequence[bool]) -> None:
    """Store each step's slice of ``flags`` in its ``image_sensitive`` field (for display and export)."""
    position = 0
    for step in steps:
        step.image_sensitive = [bool(f) for f in flags[position : position + len(step.new_tokens)]]
        position += len(step.new_tokens)
