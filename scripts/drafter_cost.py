"""Drafting cost without the model: replay a recorded stream (`scripts.record_stream`) through a drafter.

The decode loop's timings mix a drafter's own work with the model's (a forward pass leaves the caches
cold) and with whatever else runs on the machine. Replaying a recorded stream times only `propose` and
`observe`; ``--replays 0`` loads everything and replays nothing, so that under an instruction counter
the difference of two runs is the drafter's own work, independent of the machine's load:

    python -m scripts.record_stream --method tr --limit 20 --out runs/tr_stream.npz
    python -m scripts.drafter_cost --method tr --stream runs/tr_stream.npz
    python -m scripts.drafter_cost --method recap --stream tests/data/recap_scenes_stream.npz
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m scripts.drafter_cost \\
        --method recap --stream tests/data/recap_scenes_stream.npz --replays 1   # and --replays 0

Budget 80 (the recording's); a RECAP stream replays to the very trees it recorded.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace

from recap.drafters import make_drafter
from recap.drafters.recap.config import RecapConfig
from scripts.record_stream import load_stream


def replay(method: str, events: list, budget: int) -> tuple[float, float, int]:
    """Seconds spent in ``propose`` and in the decoding passes' ``observe``, and the number of passes."""
    drafter = make_drafter(method, config=RecapConfig(budget=budget))
    tree, propose, observe, passes = None, 0.0, 0.0, 0
    for kind, payload in events:
        if kind == "begin":
            drafter.begin(payload)
        elif kind == "observe":
            decoding = len(payload.tree) > 0
            if decoding:  # the loop hands back the very tree the drafter proposed
                payload = replace(payload, tree=tree)
            start = time.perf_counter()
            drafter.observe(payload)
            if decoding:
                observe += time.perf_counter() - start
        else:
            start = time.perf_counter()
            tree = drafter.propose(payload[0])
            propose += time.perf_counter() - start
            passes += 1
    return propose, observe, passes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="recap")
    parser.add_argument("--stream", required=True, help="a file written by scripts.record_stream")
    parser.add_argument("--budget", type=int, default=80)
    parser.add_argument("--replays", type=int, default=5, help="the fastest replay is reported")
    args = parser.parse_args(argv)
    events = load_stream(args.stream)
    runs = [replay(args.method, events, args.budget) for _ in range(args.replays)]
    if runs:
        propose, observe, passes = min(runs, key=lambda run: run[0] + run[1])
        print(
            f"{args.method}: {passes} passes, propose {propose / passes * 1e3:.3f} ms, "
            f"observe {observe / passes * 1e3:.3f} ms per pass (fastest of {len(runs)} replays)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
