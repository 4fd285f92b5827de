"""Command line: ``python -m recap generate --image scene.png --prompt "Describe the image."``.

Prints the answer and a one-line summary; ``--json OUT`` writes the run's step records (a trace the
studio can replay). Errors in the input are reported in one line with exit code 2, before anything
runs; an output file that cannot be written (``--json``, ``--memory``) is reported the same way after
the answer is printed. A ``--memory`` file that does not load is never overwritten.

Memories (RECAP's persistent memory, Token Recycling's matrix) start from the shipped memory of the
model's folder when one ships (the embedded models v2, the default, and v1: `recap.hotstart`),
read-only: nothing is written back to it. ``--memory FILE`` starts from FILE instead and saves a RECAP
run's memory back to it; ``--cold-start`` starts empty.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from recap.drafters import is_recap_method
from recap.drafters.token_recycling import seed_successors
from recap.hotstart import shipped_start
from recap.inputs import check_max_new_tokens, check_prompt, load_image
from recap.options import add_model_options, add_sampling_options, load_runtime, sampling_settings
from recap.state import DrafterState

log = logging.getLogger("recap.cli")


def _parser() -> argparse.ArgumentParser:
    from recap.drafters import METHODS
    from recap.runtime import DEFAULT_METHOD, EMBEDDED_MODEL

    parser = argparse.ArgumentParser(prog="python -m recap", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="answer one prompt (with an image) and report the decoding")
    gen.add_argument("--image", action="append", default=[], help="image file (repeatable; omit for text)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--method", default=DEFAULT_METHOD, choices=METHODS)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--budget", default="auto", help="tree node budget: 'auto' (cost-aware) or a number")
    gen.add_argument(
        "--memory",
        default=None,
        metavar="FILE",
        help="persistent token memory: loaded from FILE if it exists, saved back after a recap run "
        "(a file that does not load is left untouched); default: the shipped memory of the model, "
        "read-only (the embedded models have one)",
    )
    gen.add_argument(
        "--cold-start",
        action="store_true",
        help="start with empty memories (not the shipped one); the paper's cold-start setting",
    )
    gen.add_argument("--json", default=None, metavar="OUT", help="write the run's step records to this file")
    gen.add_argument("-v", "--verbose", action="store_true")
    add_model_options(gen, default_model=str(EMBEDDED_MODEL))
    add_sampling_options(gen)
    return parser


def _generate(args: argparse.Namespace) -> int:
    from recap.decode import generate
    from recap.runtime import parse_budget

    if args.memory and args.cold_start:
        raise ValueError("give either --memory FILE or --cold-start, not both")
    prompt = check_prompt(args.prompt)
    check_max_new_tokens(args.max_new_tokens)
    budget = parse_budget(args.budget)
    sampling = sampling_settings(args)
    images = [_image(path) for path in args.image]
    runtime = load_runtime(args)
    if not images and runtime.target.family_spec.vision:
        log.warning("no --image: this is a vision model, and it answers the prompt's text alone")
    problems: list[str] = []  # reported after the answer, with exit code 2
    memory_file = Path(args.memory) if args.memory else None
    save_memory = memory_file is not None and is_recap_method(args.method)
    memory_note = f"{memory_file} (new)" if memory_file is not None else "empty (cold start)"
    if memory_file is not None and memory_file.exists() and not memory_file.is_file():
        folder = memory_file.is_dir()
        kind = "a folder, not a file" if folder else "not a regular file (a device, FIFO, socket)"
        problems.append(f"--memory {memory_file} is {kind}: nothing was loaded or saved")
        save_memory = False
        memory_note = f"empty ({memory_file} not used)"
    elif memory_file is not None and memory_file.exists():
        try:
            loaded = runtime.load_persistent_memory(memory_file, method=args.method, strict=True)
            seed_successors(runtime.state.successors(), loaded)  # TR starts from the same records
            memory_note = f"{memory_file}, {len(loaded)} tokens known"
        except (ValueError, OSError) as error:
            log.warning("%s; the file is left as it is and will not be overwritten", error)
            save_memory = False
            memory_note = f"empty ({memory_file} did not load)"
    persistent = successors = None
    if memory_file is None and not args.cold_start:
        persistent, successors, memory_note = _shipped(runtime)
    state = runtime.state  # (its memory loaded from --memory, saved there after)
    if persistent is not None or successors is not None:
        state = DrafterState.given(runtime.target.vocab_size, persistent=persistent, successors=successors)
    drafter = runtime.drafter(args.method, budget=budget, state=state)
    result = generate(
        runtime.target, drafter, prompt, images, args.max_new_tokens, method=args.method, sampling=sampling
    )
    summary = result.summary
    # The answer first: a file that cannot be written below must not lose it.
    print(result.text, flush=True)
    remembers = is_recap_method(args.method) or args.method == "tr"
    print(
        f"[{args.method}] {summary.passes} target passes, {summary.tokens} tokens, "
        f"{summary.mat:.2f} accepted tokens/pass, {summary.tokens_per_s:.1f} tokens/s"
        + (f"; memory: {memory_note}" if remembers else ""),
        file=sys.stderr,
    )
    if args.json:
        settings = {
            "model": args.model,
            "method": args.method,
            "prompt": prompt,
            "max_new_tokens": args.max_new_tokens,
            "budget": args.budget,
            "dtype": str(runtime.target.dtype),
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
        }
        try:
            result.trace(settings).save(args.json)
        except OSError as error:
            problems.append(f"cannot write the trace to {args.json}: {_reason(error)}")
    if save_memory:
        try:
            runtime.save_persistent_memory(memory_file, method=args.method)
        except OSError as error:
            problems.append(f"cannot save the persistent memory to {memory_file}: {_reason(error)}")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 2 if problems else 0


def _shipped(runtime):
    """``(persistent memory, TR matrix, note)`` copied from the model's shipped memory (Nones and
    "empty" when none ships or it does not load: logged). The copies are never saved."""
    start = shipped_start(runtime.target)
    if not start.warm:
        return None, None, "empty (cold start" + (f": {start.note})" if start.note else ")")
    vocab = runtime.target.vocab_size
    persistent = start.fresh(vocab)
    return persistent, start.successors(persistent, vocab), f"shipped, {len(persistent)} tokens known"


def _image(path: str):
    """`load_image` with the path in its messages (the CLI's user named the file)."""
    try:
        return load_image(path)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def _reason(error: OSError) -> str:
    if isinstance(error, IsADirectoryError):
        return "that is a folder"
    return (error.strerror or type(error).__name__).lower()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return _generate(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
