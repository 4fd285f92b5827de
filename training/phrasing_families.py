"""Phrasing *families* of the v2 questions, generated from parts; whole families kept for evaluation only.

`training.phrasings` gave the embedded model v2 230 extra training phrasings, relation question frames
crossed with reference cues. Held-out phrasings drawn from the same frames and cues were answered well,
but a visitor's own wording was not: "compare where the two shapes are and how big they are" got a
relation of one shape with itself, "describe every shape carefully" a broken description. This module
composes phrasings from more parts, so that the wording itself says less about the question type:

- a **family** is one way of asking a question type: a few *frames* (sentence skeletons) whose words
  vary by inline alternatives ``(a|b|)`` and named synonym slots (``<image>``: image, picture, scene,
  drawing; ``<shapes>``; ``<colour>``; ``<place>`` ...). A family names the subject first or last,
  asks or commands, and may combine several requests in one sentence (where a shape is *and* how big
  it is compared with another is a relation question about the shape named as the subject; a thorough
  or complete description is a detailed description);
- a **register** wraps a frame: plain, casual ("Hey, ...", lower case without the question mark),
  polite ("Please ...", "Could you ...?"); one register, the first-person one ("I'd like ..."), is
  kept for the held-out families only;
- families are split whole: the training families (`TRAINING_FAMILIES`) are what fine-tuning asks
  (``--phrasings families``), the held-out families (`HELDOUT_FAMILIES`) are never trained on and are
  what `training.evaluate_families` scores. No held-out frame is a training frame
  (tests/test_phrasing_families.py checks frames, synonyms mapped back, and that no held-out phrasing
  contains a training one).

Placeholders: ``{kind}`` is the asked shape, the subject of a relation answer wherever the phrasing
names it; ``{other}`` the reference shape of a relation. The answer never names one shape as both: the
two are different shapes of the scene (`ask_in_family`).

The training families were written from the questions' meaning and avoid the words and word triples of
`REPHRASED_QUESTIONS` that the original training phrasings do not have (the test lists the rule), so
that older held-out set stays a test of unseen wording.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from training import phrasings as frames_v1

# The parts, re-exported: a family and its phrasings are read from this module.
from training.phrasing_parts import (  # noqa: F401
    FILLERS,
    REGISTERS,
    SLOTS,
    Family,
    Register,
    add_noise,
    cue_frames,
    expand,
    made_up_word,
)

FAMILIES: tuple[Family, ...] = (
    # ---------------------------------------------------------------- describe (a short description)
    Family("describe/what-is-shown", "describe", (
        "What('s| is) (drawn|depicted) (in the <image>|here|on the <image>)?",
        "What's shown here?",
        "What does (the|this) <image> (show|depict|hold)?",
        "What can be seen (in the <image>|here)?",
    )),
    Family("describe/brief-summary", "describe", (
        "Give a (brief|quick) (summary|overview|description) of the <image>.",
        "Give a short (summary|overview) of the <image>.",
        "(Describe|Summarise|Sum up) the <image> (briefly|in a few words|in one sentence|in short).",
        "(Quickly|Briefly) (summarise|sum up|go over) (the|this) <image>.",
    )),
    Family("describe/list-contents", "describe", (
        "List the <shapes> (in|on) the <image>.",
        "Which <shapes> are (in|on) the <image>?",
        "(What|Which) <shapes> appear in the <image>?",
        "(Tell me|Say) which <shapes> the <image> shows.",
    )),
    Family("describe/caption", "describe", (
        "(Write|Give|Suggest) a (caption|one-line caption|short caption) for (the|this) <image>.",
        "Caption (the|this) <image>.",
        "How could (the|this) <image> be captioned in a sentence?",
    )),
    Family("describe/make-up", "describe", (
        "What <shapes> make up (the|this) <image>?",
        "Which <shapes> is this <image> made of?",
        "Tell me what this <image> is made of.",
    ), heldout=True),
    Family("describe/gist", "describe", (
        "What is the gist of this <image>?",
        "Give me the gist of the <image>.",
        "In a nutshell, what is on the <image>?",
    ), heldout=True),
    Family("describe/looking-at", "describe", (
        "What am I looking at here?",
        "What is going on in this <image>?",
        "Take a look at the <image> and tell me what is there.",
    ), heldout=True),
    # ---------------------------------------------------------------------------------- colour
    Family("colour/what-colour", "colour", (
        "What <colour> (is the {kind}|does the {kind} have)?",
        "Which <colour> is the {kind} (drawn in|painted in|shown in)?",
        "What <colour> was the {kind} given?",
    )),
    Family("colour/say-the-colour", "colour", (
        "(Tell me|Say|Give|State|Report|Identify) the <colour> of the {kind}.",
        "Say which <colour> belongs to the {kind}.",
    )),
    Family("colour/shade", "colour", (
        "What (shade|hue) is the {kind}?",
        "In (which|what) (shade|hue) is the {kind} (drawn|painted|shown)?",
        "Give the (shade|hue) of the {kind}.",
    )),
    Family("colour/colour-and-place", "colour", (
        "What <colour> is the {kind}, and where is it?",
        "(Give|State|Tell me) the <colour> and the <place> of the {kind}.",
        "Which <colour> is the {kind} and (where does it appear|in which part is it)?",
    ), checks=("colour", "position")),
    Family("colour/as-for", "colour", (
        "(Regarding|Concerning|As for) the {kind}, (what|which) <colour> does it (have|show)?",
        "The {kind}'s <colour>?",
        "{kind}: (what|which) <colour>?",
    )),
    Family("colour/paint", "colour", (
        "What paint was used for the {kind}?",
        "Which paint colour went into the {kind}?",
        "The {kind} is painted in what?",
    ), heldout=True),
    Family("colour/subject-first", "colour", (
        "About the {kind}: which <colour> does it come in?",
        "The {kind}, what <colour> is that?",
        "Look at the {kind}. Its <colour>?",
    ), heldout=True),
    Family("colour/place-then-colour", "colour", (
        "Where's the {kind}, and what <colour> is it?",
        "Tell me where the {kind} is located and what its <colour> is.",
    ), heldout=True, checks=("colour", "position")),
    # ----------------------------------------------------------------------------------- count
    Family("count/how-many", "count", (
        "How many <shapes> (are there|can be seen|appear|are visible) (in the <image>|here|)?",
        "How many <shapes> does (the|this) <image> (show|hold)?",
        "How many <shapes> do you count?",
    )),
    Family("count/number-of", "count", (
        "What is the (total number|count) of (shapes|figures|items) (in the <image>|here)?",
        "(Give|Tell me|State|Report) the (total number|count) of (shapes|figures|items)( in the <image>|).",
        "Say how many <shapes> there are( in the <image>|).",
    )),
    Family("count/count-them", "count", (
        "Count (the|all the) <shapes>( in the <image>|).",
        "Count up the <shapes>( in the <image>|) and give the total.",
    )),
    Family("count/in-total", "count", (
        "(Shapes|Figures|Objects|Items) in total?",
        "Total number of (shapes|figures|items)?",
        "How many (in total|altogether)?",
    )),
    Family("count/quantity", "count", (
        "What quantity of <shapes> does the <image> hold?",
        "How big is the number of <shapes> in this <image>?",
    ), heldout=True),
    Family("count/tally", "count", (
        "Tally up the <shapes>.",
        "Do a quick tally of the <shapes> in the <image>.",
        "What's the tally of <shapes>?",
    ), heldout=True),
    Family("count/one-or-several", "count", (
        "Is there just one <shape> or are there several? How many?",
        "Are there many <shapes> here, and if so how many?",
    ), heldout=True),
    # -------------------------------------------------------------------------------- position
    Family("position/where", "position", (
        "Where (is|'s) the {kind} (drawn|shown|found|placed|)( in the <image>|)?",
        "Where (can|do) (we|you) (find|see) the {kind}( in the <image>|)?",
    )),
    Family("position/which-part", "position", (
        "Which (part|area|section|side) of the <image> (holds|shows) the {kind}?",
        "What (area|section) of the <image> holds the {kind}?",
        "In which (area|section) of the <image> (lies the {kind}|can the {kind} be found)?",
        "On which side of the <image> lies the {kind}?",
    )),
    Family("position/say-the-place", "position", (
        "(Tell me|State|Give|Report|Describe) the <place> of the {kind}.",
        "Point out the {kind}'s <place>.",
        "Find the {kind} (in|on) the <image>.",
    )),
    Family("position/grid-cell", "position", (
        "Which (grid cell|cell of the grid|cell) is the {kind} in?",
        "What cell does the {kind} (occupy|take up)?",
        "In which row and column is the {kind}?",
    )),
    Family("position/frames", "position", (
        *(f.format(kind="{kind}", ref="") for f in frames_v1.SUBJECT_FIRST_FRAMES),
        *frames_v1.POSITION_QUESTIONS,
    )),
    Family("position/as-for", "position", (
        "(Regarding|Concerning|As for) the {kind}, where (is it|does it appear|can it be found)?",
        "The {kind}'s <place>?",
        "{kind}: where?",
        "(Looking for|Searching for|Hunting for) the {kind}: where is it( in the <image>|)?",
    )),
    Family("position/lead-clause", "position", (
        "(When|If) (we|you) (look|search) for the {kind}, where (is it|does it appear)?",
        "(Looking|Searching) for the {kind}, which part of the <image> shows it?",
        "Now the {kind}: which part of the <image> (shows it|holds it)?",
    )),
    Family("position/whereabouts", "position", (
        "What are the whereabouts of the {kind}?",
        "Whereabouts is the {kind}?",
        "Whereabouts in the <image> does the {kind} show up?",
    ), heldout=True),
    Family("position/where-to-look", "position", (
        "Help me spot the {kind}: where should I look?",
        "If I want to find the {kind}, where do I look?",
    ), heldout=True),
    Family("position/what-spot", "position", (
        "At what spot of the <image> does the {kind} appear?",
        "What spot does the {kind} sit at?",
    ), heldout=True),
    # -------------------------------------------------------------------------------- relation
    Family("relation/cue-frames", "relation", cue_frames()),
    Family("relation/reference-first", "relation", (
        *frames_v1.SUBJECT_LAST_FRAMES,
        "From the {other}'s point of view, where is the {kind}?",
        "Using the {other} as the reference point, how is the {kind} placed and how <big> is it?",
        "Against the {other}, where does the {kind} stand, and is it <bigger>?",
        "Take the {other}: is the {kind} left or right of it, above or below it, <bigger> or smaller?",
    )),
    Family("relation/either-or", "relation", (
        *frames_v1.WHOLE_QUESTIONS,
        "Is the {kind} (to the left|left) or (to the right|right) of the {other}? Is it higher or lower?"
        " Is it <bigger> or smaller?",
        "On which side of the {other} is the {kind}, and which of the two is <bigger>?",
    )),
    Family("relation/place-and-size", "relation", (
        "Compare the {kind} (with|to|and) the {other} (by|in) (<place> and size|where they are and how"
        " <big> they are).",
        "Compare the (<place>s|places) and sizes of the {kind} and the {other}.",
        "How do the {kind} and the {other} compare in (<place> and size|where they are and how <big> they"
        " are)?",
        "Where are the {kind} and the {other}, and which (one|of the two) is <bigger>?",
        "Give the <place> of the {kind} (compared with|relative to) the {other}, and say which is <bigger>.",
        "Say in which direction the {kind} lies from the {other}, and how <big> it is.",
    )),
    Family("relation/arrangement", "relation", (
        "How are the {kind} and the {other} (arranged|placed|laid out)?",
        "How is the {kind} (arranged|placed|set) (beside|alongside|by) the {other}, and which is <bigger>?",
        "Explain the arrangement of the {kind} and the {other}, and how their sizes compare.",
    )),
    Family("relation/casual", "relation", (
        "{kind} vs {other}: where and how <big>?",
        "The {kind} and the {other}, which is where and which is <bigger>?",
        "{kind} versus {other}? Direction and size, please.",
    )),
    Family("relation/pair-request", "relation", (
        "(Compare|Describe|Relate|Explain|Tell me about) the {kind} (and|with|versus|against) the {other} (in"
        " (<place> and size|size and <place>)|by where they are and how <big> they are).",
        "(Describe|Relate|Explain|Tell me about) the {kind} (and|with|versus|against) the {other}.",
        "How do the {kind} and the {other} (compare|relate|line up)( in <place> and size|)?",
        "The {kind} and the {other}: how do the two compare( in <place> and size|)?",
    )),
    Family("relation/reference-marked", "relation", (
        "(From|Measured from|Relative to|In comparison with|With respect to) the {other}, (where is the"
        " {kind}|which way is the {kind}|how is the {kind} placed|where does the {kind} lie), and (is it"
        " <bigger>|which is <bigger>|how <big> is it)?",
        "With the {other} as the (anchor|origin|starting point|reference), (where|which way) is the {kind},"
        " and is it <bigger>?",
        "Go from the {other} to the {kind}: which way, and which is <bigger>?",
    )),
    Family("relation/size-then-place", "relation", (
        "(Which|What) is <bigger>, the {kind} or the {other}? And where is the {kind} (relative to|compared"
        " with) it?",
        "Is the {kind} <bigger> or smaller than the {other}, and (which way|where) is it from the {other}?",
        "(Bigger|Larger) or smaller, and (left or right|which side): the {kind} against the {other}?",
    )),
    Family("relation/mutual", "relation", (
        "(Where|How) are the {kind} and the {other} (placed|located|set out) (relative to|with respect to)"
        " each other?",
        "Say how the two <shapes>, the {kind} and the {other}, are placed and sized.",
        "Put the {kind} against the {other}: which side, above or below, and <bigger> or smaller?",
    )),
    Family("relation/viewpoint", "relation", (
        "(Viewed|Seen|Judged|Measured) from the {other}, (where|which way|in which direction) is the {kind}("
        " located|)(, and is it <bigger>|, and how <big> is it|)?",
        "(Standing|Beginning|Waiting) at the {other}, (where|which way) is the {kind}(, and is it"
        " <bigger>|)?",
        "If you (stand|begin|are) at the {other}, (where|which way) is the {kind}(, and is it <bigger>|)?",
        "Taking the {other} as the (centre|start|fixed point|origin), (locate|place|describe) the {kind} and"
        " (compare|give) its size.",
    )),
    Family("relation/measured-against", "relation", (
        "(Measure|Judge|Rate|Size up) the {kind} against the {other}: (which side|where), and (how <big>|"
        "<bigger> or smaller)?",
        "How does the {kind} (stand|fare|look) (against|beside|alongside) the {other} in <place> and size?",
        "Where does the {kind} stand (against|beside) the {other}, and what about their sizes?",
        "What can you say about the {kind} (compared with|versus|against) the {other}: (<place> and"
        " size|where and how <big>)?",
        "The {kind} (against|versus|beside) the {other}: (give|describe) (the|their) (<place>s|layout) and"
        " sizes.",
    )),
    Family("relation/both-named", "relation", (
        "(There is|Take) a {kind} and a {other}. Where is the {kind}, and is it <bigger>?",
        "Two <shapes>, the {kind} and the {other}: (where|which way) is the {kind} from the {other}, and"
        " which is <bigger>?",
        "About the {kind} and the {other}: which is where, and which is <bigger>?",
    )),
    Family("relation/relationship", "relation", (
        "What is the spatial relationship between the {kind} and the {other}?",
        "Describe the relationship between the {kind} and the {other} in space and size.",
        "How are the {kind} and the {other} related to each other?",
    ), heldout=True),
    Family("relation/contrast", "relation", (
        "Contrast the {kind} with the {other}: where is it and how large is it by comparison?",
        "In terms of placement and size, how does the {kind} differ from the {other}?",
    ), heldout=True),
    Family("relation/direction-from", "relation", (
        "Starting from the {other}, which direction leads to the {kind}, and which of them is larger?",
        "Looking from the {other}, in what direction do I find the {kind}?",
    ), heldout=True),
    Family("relation/next-to", "relation", (
        "Explain how the {kind} sits next to the {other} and which one is bigger.",
        "Where is the {kind} when you put it next to the {other}, and how do their sizes differ?",
    ), heldout=True),
    # ---------------------------------------------------------------------------------- detail
    Family("detail/in-detail", "detail", (
        "(Describe|Explain) the <image> in (full detail|depth|great detail).",
        "Give a (detailed|thorough|complete|full|careful) description of the <image>.",
        "Give a (thorough|complete|full|careful) account of the <image>.",
        "(Write|Provide) a (long|detailed|complete) description of the <image>.",
    )),
    Family("detail/shape-by-shape", "detail", (
        "Describe each <shape> in the <image>: its size, <colour>, <place> and how it relates to the others.",
        "Go through the <shapes> one by one (and describe each|in detail).",
        "Describe all the <shapes>, their sizes, <colour>s, <place>s and relations to each other.",
    )),
    Family("detail/thorough", "detail", (
        "Describe the <image> (thoroughly|carefully|completely|in depth).",
        "Leave nothing out: describe the <image>.",
        "Be thorough: what is in the <image>?",
        "(Describe|Explain) the <image> thoroughly, including how the <shapes> are placed relative to each"
        " other.",
    )),
    Family("detail/everything", "detail", (
        "Tell me all about (the|this) <image>.",
        "What is there to say about (the|this) <image>? Include all the details.",
        "Give me all the details of the <image>.",
    )),
    Family("detail/facts-list", "detail", (
        "(Describe|Cover|Go over|Walk through|Explain) (each of the|all the) <shapes>( in the <image>|),"
        " (with|including|giving) (their sizes, <colour>s and <place>s|where each is and how <big> it"
        " is|their <place>s relative to each other|how they relate to each other).",
        "For each <shape>, (give|state|say) its size, <colour> and <place>, and how it relates to the"
        " others.",
    )),
    Family("detail/long-form", "detail", (
        "Describe the <image> (meticulously|at length|in full|precisely|with care|step by step).",
        "(A|The) long (version|answer|description), please: (what is in the <image>|describe the <image>)?",
        "Describe the <image> in as much detail as possible.",
        "What is in the <image>? (Mention|Include) all the <shapes> and where they are relative to one"
        " another.",
    )),
    Family("detail/comprehensive", "detail", (
        "Provide a comprehensive description of the <image>.",
        "Give me an exhaustive account of this <image>.",
    ), heldout=True),
    Family("detail/every-shape", "detail", (
        "Go over every <shape> carefully and describe them all, with how they relate.",
        "Describe every shape in the <image>: where it is, how big it is, and where it is relative to the"
        " others.",
    ), heldout=True),
    Family("detail/spare-nothing", "detail", (
        "Spare no detail in describing this <image>.",
        "Tell me absolutely everything about the <image>.",
    ), heldout=True),
)  # fmt: skip

TRAINING_FAMILIES = tuple(f for f in FAMILIES if not f.heldout)
HELDOUT_FAMILIES = tuple(f for f in FAMILIES if f.heldout)


def training_groups(
    families: tuple[Family, ...] = TRAINING_FAMILIES,
) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Per question type, one group of phrasings per (family, register): a draw picks a group, then a
    phrasing (`ask_in_family`), so every family and register is asked as often whatever its size."""
    groups: dict[str, list[tuple[str, ...]]] = {}
    for family in families:
        for phrasings in family.by_register().values():
            groups.setdefault(family.qtype, []).append(phrasings)
    return {qtype: tuple(gs) for qtype, gs in groups.items()}


def ask_in_family(
    scenes: ModuleType, scene, qtype: str, groups: tuple[tuple[str, ...], ...], rng: np.random.Generator
) -> tuple[str, str, list[tuple[int, int, int]]]:
    """(question, reference answer, its shape spans) with a phrasing drawn from ``groups`` (a group,
    then one of its phrasings). ``{kind}`` is the first asked shape, the answer's subject, wherever the
    phrasing names it; ``{other}`` a different shape of the scene (relation)."""
    # One group draws no group index, so `training.phrasings`' single list keeps its random stream.
    group = groups[int(rng.integers(len(groups)))] if len(groups) > 1 else groups[0]
    template = group[int(rng.integers(len(group)))]
    n_asked = 2 if qtype in scenes.TWO_SHAPE_TYPES else 1
    picked = rng.choice(scene.count, size=n_asked, replace=False)  # distinct shapes
    targets = tuple(scene.shapes[int(i)].kind for i in picked)
    answer, spans = scenes.answer_with_spans(scene, qtype, targets)
    return template.format(kind=targets[0], other=targets[-1]), answer, spans
