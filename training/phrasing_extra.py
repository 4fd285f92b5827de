"""Phrasing families added after the shipped fine-tuning's families were fixed (`training.phrasing_families`
holds those): extra training families that ``--phrasings mixed-plus``, ``mixed-roles`` and
``mixed-from`` add, and the *probe* families, a second held-out set written before any model was
trained on ``mixed-roles``.

- `EXTRA_FAMILIES` (``mixed-plus``): three relation families that name the reference first.
- `ROLE_FAMILIES` (``mixed-roles``, with the extra ones): relation questions whose subject and reference
  are told apart by the preposition, not by the verb or the order the shapes are named in. A lead-in
  verb slot (``<going>``) takes many verbs, so that no verb says which shape is the reference: the shape
  after *from* (or *at*) is where a direction starts, the reference; the shape a direction goes *to*
  (*toward*, *reach*) is the subject, whichever is named first. Written after the held-out family
  ``relation/direction-from`` was read to fail with the roles swapped (the subject named last, after
  "to"), which is why the probe families below exist.
- `FROM_FAMILIES` (``mixed-from``): the role families without the one whose subject follows "to".
- `PROBE_FAMILIES` (``python -m training.evaluate_families --split probe``): held-out families of other
  two-shape structures, and one position and one detail family, written before ``mixed-roles`` was
  trained and never trained on, in wording no training family uses (tests/test_phrasing_families.py
  checks the same rules as for the held-out families). They tell whether a gain on the held-out
  families carries over to other wording.
"""

from __future__ import annotations

from training.phrasing_parts import Family

#: Relation training families added after the shipped fine-tuning's families were fixed, asked by
#: ``--phrasings mixed-plus`` only (so that ``families`` and ``mixed`` generate what they always did):
#: the reference named first in a lead-in clause, then the subject after a verb ("Going from the Y,
#: which way ... to reach the X"), the subject set against the reference ("How is the X unlike
#: the Y ..."), and the reference made the anchor before the subject is named ("With the Y as your
#: landmark, where will you spot the X?").
EXTRA_FAMILIES: tuple[Family, ...] = (
    Family("relation/reference-lead", "relation", (
        "(Taking|Choosing|Picking|Beginning with|Focusing on) the {other} (first|as the reference|),"
        " (say|tell me|explain) (which way|in which direction) the {kind} (lies|is placed)( and (whether|if)"
        " it is <bigger>| and how <big> it is|).",
        "(Going|Moving|Heading|Travelling) (out |)from the {other}, which way (do you|must you)"
        " (go|turn|head) to (reach|get to|arrive at) the {kind}(, and which is <bigger>|)?",
        "(Once|After) you (have located|locate|see) the {other}, where is the {kind}(, and how <big> is"
        " it|)?",
        "(Regarding|Concerning|Near) the {other}: how is the {kind} (placed|set|laid out), and which (one|)"
        " is <bigger>?",
    )),
    Family("relation/set-against", "relation", (
        "How is the {kind} unlike the {other} in <place> and size?",
        "What (separates|distinguishes) the {kind} from the {other} in <place> and size?",
        "(Hold|Set|Weigh) the {kind} up against the {other}: where is it, and (is it <bigger>|how <big> is"
        " it)?",
        "Say which way the {kind} (goes|ends up|lies) (if|when) (placed|set|laid) (beside|by|alongside) the"
        " {other}, and whether it is <bigger>.",
        "(In|By) (<place> and size|size and <place>), how (does|do) the {kind} (measure up|compare) (to|with)"
        " the {other}?",
    )),
    Family("relation/anchor-then-subject", "relation", (
        "(With|Using) the {other} as (your|the|an) (anchor|landmark|fixed point), (where|on which side) will"
        " you (catch|see|meet) the {kind}(, and is it <bigger>|)?",
        "The {other} is (my|our|the) (anchor|landmark). (Where|On which side) is the {kind}, and which (one|)"
        " is <bigger>?",
        "(Keep|Fix) your eyes on the {other}: (where|which way) do you (turn|glance|head) (for|to catch) the"
        " {kind}(, and is it <bigger>|)?",
    )),
)  # fmt: skip

ROLE_FAMILIES: tuple[Family, ...] = (
    Family("relation/from-reference", "relation", (
        "<going> from the {other}, (which way|in which direction|where) is the {kind}(, and is it <bigger>|"
        ", and which is <bigger>|)?",
        "<going> (out |)from the {other}, (where|which way) do you (find|reach|meet) the {kind}(, and how"
        " <big> is it|)?",
        "(Standing|Waiting|Stopping|Pausing|Resting) at the {other}, (which way|where) is the {kind}(, and is"
        " it <bigger>|)?",
        "(Where|Which way) is the {kind} (when|if) (you are|you stand|you begin) (at|by) the {other}(, and"
        " which is <bigger>|)?",
    )),
    Family("relation/to-subject", "relation", (
        "(Which way|What way|In which direction) (goes|heads|points|turns) from the {other} to the {kind}(,"
        " and which (one|) is <bigger>|)?",
        "<going> (toward|towards|to) the {kind} from the {other}: which way(, and is it <bigger>|)?",
        "What (route|way) (takes|brings|gets) you from the {other} to the {kind}(, and which is"
        " <bigger>|)?",
        "(From|Out of) the {other}, (which way|what way) (do you go|must you go|is it) to (reach|get to)"
        " the {kind}(, and is the {kind} <bigger>|)?",
        "To (reach|get to|arrive at) the {kind} (from|out of) the {other}, which way (do you go|must you"
        " turn)(, and is it <bigger>|)?",
    )),
    Family("relation/subject-clause", "relation", (
        "The {kind}: (where|which way) is it from the {other}(, and is it <bigger>|)?",
        "Say which way the {kind} (lies|is placed) (from|when seen from|when viewed from) the {other}(, and"
        " which is <bigger>|).",
        "(Where|Which way) (is|lies) the {kind}, (going|counting|measuring|seen) from the {other}(, and how"
        " <big> is it|)?",
    )),
)  # fmt: skip

#: The role families without ``relation/to-subject`` (``--phrasings mixed-from``): that family's "to the X"
#: (the subject) taught the model to read the shape after "to the" as the subject in "next to the Y" too.
FROM_FAMILIES = tuple(f for f in ROLE_FAMILIES if f.name != "relation/to-subject")

#: Held-out two-shape families of other structures (the reference as a viewer, a walk from one shape to
#: the other, the subject first with "in relation to", the reference set in a sentence of its own),
#: and one each of position and detail. Never trained on.
PROBE_FAMILIES: tuple[Family, ...] = (
    Family("relation/probe-viewer", "relation", (
        "Imagine you are the {other}. Where is the {kind} from where you stand, and is it larger than you?",
        "Put yourself in the {other}'s place: how is the {kind} positioned for you, and which of you is"
        " bigger?",
    ), heldout=True),
    Family("relation/probe-walk", "relation", (
        "I walk over from the {other} to the {kind}. Which way did I go, and which shape was larger?",
        "A path runs from the {other} to the {kind}: what direction does it take, and which end is bigger?",
    ), heldout=True),
    Family("relation/probe-in-relation", "relation", (
        "How would you place the {kind} with regard to the {other}, and which is larger?",
        "Where is the {kind} in relation to the {other}, and which one is larger?",
    ), heldout=True),
    Family("relation/probe-given", "relation", (
        "Given where the {other} is, where does the {kind} appear, and which is larger?",
        "Keep the {other} in mind. Now, where is the {kind} compared with it, and is it bigger?",
    ), heldout=True),
    Family("position/probe-pinpoint", "position", (
        "Pinpoint the {kind} for me.",
        "In what part of the picture will I find the {kind}?",
    ), heldout=True),
    Family("detail/probe-rundown", "detail", (
        "I need a full rundown of the picture: every shape, where it is, and how they relate.",
        "Write up a careful report on everything shown, shape after shape.",
    ), heldout=True),
)  # fmt: skip
