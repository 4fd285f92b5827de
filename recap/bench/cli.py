"""The benchmark's command line: ``python -m recap.bench --dataset scenes2 --out runs/scenes2``.

Every argument is checked before a model loads; bad arguments or inputs end with a one-line
``error: ...`` on stderr and exit code 2. The results table goes to stdout, the files to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from recap.bench.datasets import SPECBENCH_ENV, check_scene_world, default_dataset, load_dataset
from recap.bench.report import markdown_table, write_outputs
from recap.bench.runner import StreamSettings, normalize_methods, run_benchmark
from recap.drafters import METHODS
from recap.drafters.suffix_decoding import SuffixConfig, SuffixTreeCache
from recap.hotstart import BUILD_COMMAND
from recap.memory.fingerprint import model_fingerprint
from recap.memory.persistent import PersistentMemory
from recap.models.cost import load_curve
from recap.options import (
    add_model_options,
    add_sampling_options,
    check_model_options,
    load_runtime,
    sampling_settings,
)
from recap.runtime import EMBEDDED_MODEL, Runtime, parse_budget


def _description() -> str:
    """The first line of the package's docstring (one wording for ``--help`` and the docs)."""
    import recap.bench

    return (recap.bench.__doc__ or "").splitlines()[0]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recap.bench", description=_description())
    parser.add_argument(
        "--dataset",
        default=None,
        help="scenes2 / scenes2-rephrased / scenes2-detail (embedded model v2), scenes / scenes-rephrased "
        "(v1), photos, mtbench, specbench or a .jsonl file (default: the model's own scenes: scenes for "
        "v1, else scenes2)",
    )
    parser.add_argument(
        "--data-file",
        default=None,
        metavar="FILE",
        help=f"the question file of specbench (or of mtbench); default: ${SPECBENCH_ENV} for specbench",
    )
    parser.add_argument(
        "--methods", default="ar,pld,tr,recap", help=f"comma-separated: {', '.join(METHODS)}, all"
    )
    parser.add_argument("--limit", type=int, default=None, help="use the first K samples")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=1, help="untimed AR warm-up requests")
    parser.add_argument(
        "--budget",
        default=None,
        help="RECAP's tree budget (its ablations' too): 'auto' (cost-aware, the default) or a node count; "
        "Token Recycling always drafts its 80-node template, PLD and SuffixDecoding their own sizes",
    )
    defaults = SuffixConfig()
    parser.add_argument(
        "--suffix-max-spec-tokens",
        type=int,
        default=defaults.max_spec_tokens,
        help="suffix: most draft nodes per pass (its authors' default; --budget does not apply)",
    )
    parser.add_argument("--suffix-max-spec-factor", type=float, default=defaults.max_spec_factor)
    parser.add_argument("--suffix-min-token-prob", type=float, default=defaults.min_token_prob)
    parser.add_argument("--cold", action="store_true", help="reset persistent memories between samples")
    parser.add_argument(
        "--no-coverage",
        action="store_true",
        help="skip the covered/drafted/accepted probe (it reads the memories before each update: "
        "leave it out when measuring drafting cost)",
    )
    parser.add_argument(
        "--memory",
        default=None,
        metavar="FILE",
        help="start RECAP's persistent memory and TR's matrix from this saved memory of the model "
        "(e.g. assets/memory/tiny-scenes-llava-v2.safetensors) instead of empty; default: a cold start",
    )
    parser.add_argument(
        "--cost-curve",
        default=None,
        metavar="FILE",
        help="replay a recorded tree-cost curve instead of measuring this device's: a JSON list of "
        "[tokens, milliseconds] or a results.json that recorded one (e.g. a GPU's, on a CPU)",
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true")
    add_model_options(parser, default_model=str(EMBEDDED_MODEL))
    add_sampling_options(parser)
    return parser


def local_image_size(model: str) -> int | None:
    """The vision input size in a local model folder's ``config.json`` (None for a hub id, a text model
    or a config without one); read without loading the model."""
    config_file = Path(model).expanduser() / "config.json"
    try:
        size = json.loads(config_file.read_text(encoding="utf-8"))["vision_config"]["image_size"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return size if isinstance(size, int) else None


def start_memory(runtime: Runtime, path: str) -> PersistentMemory:
    """The saved memory at ``path``, checked against ``runtime``'s model (tokenizer, weights digest,
    vocabulary, k); ValueError with the reason if it is missing, damaged or made for another model."""
    target = runtime.target
    try:
        return PersistentMemory.read(Path(path).expanduser(), model_fingerprint(target), target.vocab_size)
    except FileNotFoundError:
        raise ValueError(f"memory file not found: {path}") from None
    except ValueError as error:
        raise ValueError(f"{error}; {BUILD_COMMAND} --model ... makes one for a model") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry; returns the exit code (2 for bad arguments or inputs)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return _bench(args, "python -m recap.bench " + shlex.join(argv))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _bench(args: argparse.Namespace, command: str) -> int:

    from recap.inputs import check_max_new_tokens

    # Check everything cheap before loading a model.
    methods = normalize_methods(args.methods)
    check_max_new_tokens(args.max_new_tokens)
    budget = parse_budget(args.budget) if args.budget is not None else None
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    sampling = sampling_settings(args)
    check_model_options(args)
    suffix_config = SuffixConfig(
        max_spec_tokens=args.suffix_max_spec_tokens,
        max_spec_factor=args.suffix_max_spec_factor,
        min_token_prob=args.suffix_min_token_prob,
    )
    if "suffix" in methods:
        SuffixTreeCache.for_config(suffix_config)  # says how to install arctic-inference before loading
    image_size = local_image_size(args.model)
    if args.dataset is None:  # the model's own; recorded in the command, so that it reproduces the run
        args.dataset = default_dataset(image_size)
        command += " --dataset " + shlex.quote(args.dataset)
    data_file = args.data_file
    if data_file is None and args.dataset == "specbench":
        data_file = os.environ.get(SPECBENCH_ENV) or None
        if data_file:  # recorded by its name (no machine path), as `data_file` below
            command += " --data-file " + shlex.quote(Path(data_file).name)
    samples = load_dataset(args.dataset, args.limit, data_file=data_file)
    check_scene_world(args.dataset, image_size)  # v1 scenes for v2's model: refused
    curve = load_curve(args.cost_curve) if args.cost_curve is not None else None
    if args.memory is not None and not Path(args.memory).expanduser().is_file():
        raise ValueError(f"memory file not found: {args.memory}")
    runtime = load_runtime(args)
    if curve is not None:
        runtime.use_cost_model(curve)
    start = start_memory(runtime, args.memory) if args.memory is not None else None
    result = run_benchmark(
        runtime,
        samples,
        methods,
        max_new_tokens=args.max_new_tokens,
        warmup=args.warmup,
        setup=StreamSettings(
            budget, suffix_config=suffix_config, sampling=sampling, start=start, cold=args.cold
        ),
        coverage=not args.no_coverage,
        progress=not args.no_progress,
        settings={
            "dataset": args.dataset,
            "data_file": Path(data_file).name if data_file else None,  # no machine path in results
            "limit": args.limit,
            "command": command,
            **({"cost_curve_file": Path(args.cost_curve).name} if args.cost_curve else {}),
            **({"memory_file": Path(args.memory).name} if args.memory else {}),
        },
        projection=curve,
    )
    write_outputs(result, args.out)
    print(markdown_table(result))
    print(f"wrote {args.out}/results.json, results.md and charts", file=sys.stderr)
    return 0
