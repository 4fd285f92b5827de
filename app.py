"""RECAP Studio, the Space's entry point: builds the studio and serves it.

The studio lives in `recap.studio` (layout, handlers, serving, validation, renderers; see its package
docstring); its environment variables are documented in `recap.studio.environment`. Importing this
module builds nothing and loads no model; ``python app.py`` builds the Blocks and serves them.
"""

from __future__ import annotations

import logging
import time

from recap.drafters.recap.search import compile_kernels
from recap.studio.compare import prewarm_in_background
from recap.studio.demo import build_demo
from recap.studio.environment import launch_kwargs, queue_kwargs

__all__ = ["build_demo", "launch_kwargs", "main"]

log = logging.getLogger("recap.studio")


def main() -> None:
    """Serve the studio (address, theme and CSS from `launch_kwargs`, the queue's bounds from
    `queue_kwargs`)."""
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
    prewarm_in_background(demo.studio)  # loads the default model, warms Compare's drafters
    demo.queue(**queue_kwargs()).launch(**launch_kwargs())


if __name__ == "__main__":
    main()
