"""RECAP Studio, the Space's entry point: builds the studio and serves it.

The studio lives in `recap.studio` (layout, handlers, serving, validation, renderers; see its package
docstring); its environment variables are documented in `recap.studio.environment`. Importing this
module builds nothing and loads no model; ``python app.py`` builds the Blocks and serves them.
"""

from __future__ import annotations

import argparse
import gc
import logging
import time
from collections.abc import Sequence

from recap.drafters.recap.search import compile_kernels
from recap.studio.demo import build_demo
from recap.studio.environment import launch_kwargs, queue_kwargs
from recap.studio.ui.compare import prewarm_in_background

__all__ = ["build_demo", "launch_kwargs", "main"]

log = logging.getLogger("recap.studio")


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a whole number from 1 to 65535, got {text!r}")
    return int(text)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python app.py",
        description="Serve RECAP Studio (the embedded model on a CPU; every setting an environment "
        "variable: docs/studio.md).",
    )
    parser.add_argument(
        "--host", default=None, help="address to serve on (default: $GRADIO_SERVER_NAME or 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=_port, default=None, help="port to serve on (default: $GRADIO_SERVER_PORT or 7860)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the studio (address, theme and CSS from `launch_kwargs`, the queue's bounds from
    `queue_kwargs`; ``--host`` and ``--port`` override the address)."""
    args = _arguments(argv)  # (--help and a bad option exit here, before anything is built)
    overrides = {"server_name": args.host, "server_port": args.port}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # RECAP's compiled search: compiled (or loaded from numba's cache) before any visitor
    log.info(
        "starting: compiling RECAP's search kernels (first start only: up to a minute on a small CPU; "
        "later starts load them from numba's cache in seconds)…"
    )
    start = time.perf_counter()
    compile_kernels()
    log.info("kernels ready in %.1f s; building the studio", time.perf_counter() - start)
    demo = build_demo()
    # The studio's objects live as long as the process (gradio's, plotly's, torch's, numba's: about
    # 400,000): frozen, no collection scans them again. Unfrozen, a full collection paused every thread
    # for 0.1-0.3 s, inside a visitor's timed verify phase (a 525 ms step on a first click).
    gc.collect()
    gc.freeze()
    prewarm_in_background(demo.studio)  # loads the default model, warms Compare's drafters
    options = {**launch_kwargs(), **{name: value for name, value in overrides.items() if value is not None}}
    demo.queue(**queue_kwargs()).launch(**options)


if __name__ == "__main__":
    main()
