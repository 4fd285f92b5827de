"""What the Compare tab's story line says on every shipped example of the default model.

Builds the studio in this process (a fresh server: the embedded default model), runs the Compare tab's
handler once per example with the page's default settings (as a click does) and prints, per example,
each method's accepted drafts at the image-dependent tokens (and how many it drafted there), TR's and
RECAP's split by where each met them (a pass's first draft, or deeper), then how many examples have
RECAP at or above Token Recycling there (and strictly above). ``--headlines`` also prints the headline
the tab shows above its counts (at most two sentences: who accepted more there, and at one token why).

    python -m scripts.compare_story [--budgets equal|device] [--warmup N] [--headlines]
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

from scripts import compare_spread

#: "Accepted drafts there (drafted there): Token Recycling 8 (9), RECAP 2 (7)."
COUNTS = re.compile(r"Accepted drafts there \(drafted there\): (?P<parts>[^.]*)\.")
#: "Accepted there at a pass's first draft, ...: TR 1 of 2, RECAP 1 of 1; after ...: TR none met there,
#: RECAP 1 of 1."
DEPTHS = re.compile(
    r"Accepted there at a pass's first draft[^:]*: (?P<first>[^;]*); after[^:]*: (?P<deeper>[^.]*)\."
)
PART = re.compile(r"(?P<label>[A-Za-z][A-Za-z ]*?) (?P<accepted>\d+) \((?P<drafted>\d+)\)")


def counts(line: str) -> dict[str, tuple[int, int]]:
    """Method label -> (accepted, drafted) at the image-dependent tokens, read off a story line ({} when
    the line has no counts: no token depended on the image)."""
    found = COUNTS.search(html.unescape(re.sub(r"<[^>]+>", "", line)))
    if not found:
        return {}
    return {
        m["label"].strip(): (int(m["accepted"]), int(m["drafted"])) for m in PART.finditer(found["parts"])
    }


def headline(story_html: str) -> str:
    """The story's headline as the page shows it (the paragraph above the folded counts), as text."""
    return html.unescape(re.sub(r"<[^>]+>", "", story_html.split("<details", 1)[0])).strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", choices=("equal", "device"), default="equal")
    parser.add_argument(
        "--warmup", type=int, default=None, help="requests each method is warmed on (default: 8)"
    )
    parser.add_argument("--headlines", action="store_true", help="print each story's headline too")
    args = parser.parse_args(argv)
    if args.warmup is not None and not 0 <= args.warmup <= 256:
        parser.error("--warmup must be a whole number from 0 to 256")
    import torch

    from recap.studio.environment import DEFAULT_MODEL_ID
    from recap.studio.ui.examples import examples

    torch.set_num_threads(1)
    compare, defaults = compare_spread.compare_handler(args.warmup)
    wins = ahead = 0
    shown = examples(DEFAULT_MODEL_ID)
    for number, (image, prompt) in enumerate(shown, start=1):
        *_, final = compare(*compare_spread.click_inputs(defaults, image, prompt, args.budgets))
        line = next((v for v in final.values() if isinstance(v, str) and "depend on the image" in v), "")
        seen = counts(line)
        tr, recap = seen.get("Token Recycling", (0, 0)), seen.get("RECAP", (0, 0))
        wins += recap[0] >= tr[0]
        ahead += recap[0] > tr[0]
        parts = (
            ", ".join(f"{label} {a} ({d})" for label, (a, d) in seen.items()) or "no image-dependent token"
        )
        print(f"{number}. {Path(image).name} {prompt!r}: {parts}")
        if args.headlines:
            print(f"   {headline(line)}")
        split = DEPTHS.search(html.unescape(re.sub(r"<[^>]+>", "", line)))
        if split:
            print(f"   at a pass's first draft: {split['first']}; deeper: {split['deeper']}")
    print(f"RECAP accepted more drafts than Token Recycling there on {ahead} of {len(shown)}")
    print(f"RECAP accepted as many drafts as Token Recycling there or more on {wins} of {len(shown)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
