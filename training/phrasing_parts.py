"""The parts phrasing families are made of (`training.phrasing_families`): named synonym slots and inline
alternatives (`expand`), registers that wrap a frame (`Register`, `REGISTERS`), the `Family` of frames
for one question type, and the word noise training adds to questions (`add_noise`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from recap.embedded.scenes2_questions import TRAINING_QUESTIONS
from training import phrasings as frames_v1

#: Named synonym slots, ``<name>`` in a frame.
SLOTS: dict[str, str] = {
    "image": "image|picture|scene|drawing",
    "shapes": "shapes|figures|objects|items",
    "shape": "shape|figure|object|item",
    "colour": "colour|color",
    "place": "position|location|place",
    "bigger": "bigger|larger",
    "big": "big|large",
    # Lead-in verbs of `training.phrasing_extra.ROLE_FAMILIES`: many, so that the verb carries no role.
    "going": "Going|Moving|Heading|Travelling|Walking|Running|Stepping|Setting out|Coming|Working|Counting|"
    "Reading|Glancing|Gazing|Peering|Turning|Pointing|Sliding|Drifting|Measuring|Judging",
}

_SLOT_RE = re.compile(r"<([a-z]+)>")


def expand(pattern: str) -> tuple[str, ...]:
    """Every string ``pattern`` stands for: ``<slot>`` becomes that slot's alternatives, ``(a|b|)``
    one of ``a``, ``b`` or nothing (groups may nest); spaces are tidied. In a fixed order, no repeats."""
    text = _SLOT_RE.sub(lambda m: "(" + SLOTS[m.group(1)] + ")", pattern)
    return tuple(dict.fromkeys(_tidy(s) for s in _alternatives(text)))


def _alternatives(text: str) -> list[str]:
    start = text.find("(")
    if start < 0:
        if ")" in text or "|" in text:
            raise ValueError(f"unbalanced alternatives in {text!r}")
        return [text]
    depth, parts, begin = 0, [], start + 1
    for j in range(start, len(text)):
        c = text[j]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                parts.append(text[begin:j])
                end = j
                break
        elif c == "|" and depth == 1:
            parts.append(text[begin:j])
            begin = j + 1
    else:
        raise ValueError(f"unbalanced alternatives in {text!r}")
    head, tails = text[:start], _alternatives(text[end + 1 :])
    return [head + a + t for p in parts for a in _alternatives(p) for t in tails]


def _tidy(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r" ([?.,:!]|'s\b)", r"\1", text)  # no space before punctuation or "'s"


# ------------------------------------------------------------------------------------------ registers
@dataclass(frozen=True)
class Register:
    """Ways to wrap a frame. In ``questions`` (for a frame ending in "?") and ``commands`` (any other),
    ``{Q}`` is the frame as written, ``{q}`` the frame with a lower-case first letter and ``{bare}``
    that without its final punctuation."""

    name: str
    questions: tuple[str, ...]
    commands: tuple[str, ...]
    heldout: bool = False
    #: First words of the commands this register leaves unwrapped.
    avoid: tuple[str, ...] = ()

    def wrap(self, core: str) -> tuple[str, ...]:
        """``core`` in each of this register's wrappers that fit it: a question's by the end of its first
        sentence; no wrapper makes a question of a command of several sentences, or says please twice."""
        first = core.split(" ", 1)[0]
        lower = core if first == "I" or first.startswith("I'") else core[:1].lower() + core[1:]
        bare = lower.rstrip("?.!")
        sentences = re.split(r"(?<=[.?:!]) ", core)
        question = sentences[0].endswith("?")
        wrappers = [
            w
            for w in (self.questions if question else self.commands)
            if not (len(sentences) > 1 and not question and w.endswith("?"))
            and not ("please" in w and "please" in core.lower())
            and not (not question and first.lower() in self.avoid)
        ]
        return tuple(w.format(Q=core, q=lower, bare=bare) for w in wrappers)


REGISTERS: tuple[Register, ...] = (
    Register("plain", ("{Q}",), ("{Q}",)),
    Register(
        "casual",
        ("Hey, {q}", "So, {q}", "Quick question: {q}", "{bare}", "ok, {bare}?"),
        ("Hey, {q}", "{bare}, thanks.", "{bare}", "ok, {bare}."),
    ),
    Register(
        "polite",
        ("Excuse me, {q}", "One question, please: {q}", "{bare}, please?"),
        ("Kindly {q}", "Could you kindly {bare}?", "{bare}, please.", "If possible, {q}"),
    ),
    # "Can you compare / tell / give / count ..." is how REPHRASED_QUESTIONS asks: left to them.
    Register(
        "can-you",
        ("Can you answer this: {q}",),
        ("Can you {bare}?",),
        avoid=("compare", "tell", "give", "count", "name"),
    ),
    Register(
        "first-person",
        ("I'd like to know: {q}", "I'm curious, {q}", "I was wondering: {q}"),
        ("I'd like you to {q}", "I want you to {q}", "Would you {bare}?"),
        heldout=True,
    ),
)


# ------------------------------------------------------------------------------------------ families
@dataclass(frozen=True)
class Family:
    """One way of asking question type ``qtype``: ``frames`` (patterns for `expand`) wrapped in every
    register its split may use. ``checks`` are the fact types an answer must get right (``qtype``'s by
    default; a combined request names several, e.g. colour and position)."""

    name: str
    qtype: str
    frames: tuple[str, ...]
    heldout: bool = False
    checks: tuple[str, ...] = ()

    @property
    def facts(self) -> tuple[str, ...]:
        return self.checks or (self.qtype,)

    def cores(self) -> tuple[str, ...]:
        """The frames' expansions, unwrapped, without repeats and without `TRAINING_QUESTIONS` strings."""
        original = {q.lower() for qs in TRAINING_QUESTIONS.values() for q in qs}
        expanded = (s for frame in self.frames for s in expand(frame))
        return tuple(s for s in dict.fromkeys(expanded) if s.lower() not in original)

    def registers(self) -> tuple[Register, ...]:
        return tuple(r for r in REGISTERS if self.heldout or not r.heldout)

    def by_register(self) -> dict[str, tuple[str, ...]]:
        """The family's phrasings per register name (a register that fits none of its frames left out)."""
        cores = self.cores()
        wrapped = {
            r.name: tuple(dict.fromkeys(p for c in cores for p in r.wrap(c))) for r in self.registers()
        }
        return {name: phrasings for name, phrasings in wrapped.items() if phrasings}

    def phrasings(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for ps in self.by_register().values() for p in ps))


def cue_frames() -> tuple[str, ...]:
    cues = "|".join((*frames_v1.REFERENCE_CUES, "beside", "against", "alongside"))
    ref = f" ({cues}) the {{other}}"
    return tuple(f.format(kind="{kind}", ref=ref) for f in frames_v1.SUBJECT_FIRST_FRAMES)


# ------------------------------------------------------------------------------------- word noise
#: Words that add nothing to a question, for `add_noise`.
FILLERS = (
    "just", "now", "then", "also", "actually", "really", "maybe", "perhaps", "again", "simply", "well",
    "okay", "basically", "quite", "still", "today", "so", "oh", "hmm", "um",
)  # fmt: skip
#: Words a made-up word must not be: the shapes, colours and the words of positions and relations.
_MEANINGFUL = {
    "circle", "square", "triangle", "star", "diamond", "cross", "ring", "heart",
    "red", "orange", "yellow", "lime", "green", "cyan", "blue", "purple", "pink", "brown", "grey", "black",
    "left", "right", "above", "below", "top", "bottom", "middle", "center", "centre", "same", "size",
    "row", "column", "larger", "smaller", "bigger", "detail", "many", "colour", "color",
}  # fmt: skip
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def made_up_word(rng: np.random.Generator) -> str:
    """A random lower-case string of 4-9 letters that is none of the words that carry a fact."""
    while True:
        word = "".join(_LETTERS[int(i)] for i in rng.integers(len(_LETTERS), size=int(rng.integers(4, 10))))
        if word not in _MEANINGFUL:
            return word


def add_noise(question: str, rng: np.random.Generator) -> str:
    """``question`` with one or two words inserted between its words: a filler ("just", "actually")
    or a made-up word (half each). The asked shapes and every other word stay as they were."""
    words = question.split(" ")
    for _ in range(int(rng.integers(1, 3))):
        word = FILLERS[int(rng.integers(len(FILLERS)))] if rng.random() < 0.5 else made_up_word(rng)
        words.insert(int(rng.integers(len(words) + 1)), word)
    return " ".join(words)
