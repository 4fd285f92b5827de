"""Every scenario the vLLM tests compare, run in one engine with one speculative method.

    python tests/in_vllm/scenario.py --method recap --model runs/models/smollm2-135m-instruct --out out.json
    python tests/in_vllm/scenario.py --method recap --model assets/models/tiny-scenes-llava-v2 \
        --scenes 8 --out out.json         # the vision scenario (`vision`; --method transformers: `reference`)

vLLM's engine owns its process, so each method runs in a subprocess of its own (`tests/in_vllm/conftest.py`)
and the tests compare the JSON files: the token ids of every request of every scenario, the errors the
engine answered, and (RECAP) what the proposer holds at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

for name, value in (
    ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),  # the engine in this process: the proposer is readable
    ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
    ("VLLM_CPU_KVCACHE_SPACE", "1"),
    ("OMP_NUM_THREADS", "1"),
):
    os.environ.setdefault(name, value)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: recap.vllm

#: The model's length limit in these scenarios (small, so that a request can run into it).
MAX_MODEL_LEN = 384
K = 4
#: New tokens of each scene's answer in the vision scenario.
SCENE_TOKENS = 64

QUESTIONS = (
    "Write a short poem about the sea.",
    "What is 12 times 13? Explain step by step.",
    "List three uses of copper.",
    "Write a short poem about the sea.",
    "Explain what a prime number is to a child.",
    "Give me a recipe for pancakes.",
    "What is the capital of France? Answer in one sentence.",
    "Describe a sunset over the mountains.",
    "Translate 'good morning' into French, Spanish and German.",
    "Why is the sky blue?",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenes", type=int, default=0, help="the vision scenario on this many scenes")
    args = parser.parse_args()
    if args.scenes:
        (reference if args.method == "transformers" else vision)(args)
        return

    from vllm import LLM, SamplingParams
    from vllm.exceptions import VLLMClientError

    from scripts.vllm_bench import speculative_config  # (the benchmark's engines, the same settings)

    llm = LLM(
        args.model, dtype="float32", enforce_eager=True, max_model_len=MAX_MODEL_LEN, seed=0,
        max_num_seqs=16, speculative_config=speculative_config(args.method, K),
    )  # fmt: skip
    tokenizer = llm.get_tokenizer()
    engine = llm.llm_engine

    def prompt(question: str) -> list[int]:
        messages = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))

    def greedy(tokens: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=False)

    def run(schedule: dict[int, list[tuple[str, list[int], SamplingParams]]], aborts: dict[int, list[str]]):
        """Drive the engine step by step: requests join at the steps ``schedule`` names, ``aborts``
        abort requests at a step; returns each request's tokens and finish reason."""
        outputs: dict[str, dict] = {}
        step = 0
        while step <= max(schedule) or engine.has_unfinished_requests():
            for req_id, ids, params in schedule.get(step, []):
                engine.add_request(req_id, {"prompt_token_ids": ids}, params)
            if step in aborts:
                engine.abort_request(aborts[step])
            for output in engine.step():
                completion = output.outputs[0]
                outputs[output.request_id] = {
                    "tokens": list(completion.token_ids), "finish": completion.finish_reason,
                }  # fmt: skip
            step += 1
        return outputs

    results: dict[str, object] = {}
    # 1. Eight requests at once, of different lengths.
    batch = [(f"b{i}", prompt(QUESTIONS[i]), greedy(16 + 14 * i)) for i in range(8)]
    results["batch"] = run({0: batch}, {})
    # 2. Requests joining and leaving mid-batch; one aborted while it runs.
    schedule = {
        0: [("j0", prompt(QUESTIONS[0]), greedy(60)), ("j1", prompt(QUESTIONS[8]), greedy(12))],
        3: [("j2", prompt(QUESTIONS[5]), greedy(48)), ("j3", prompt(QUESTIONS[3]), greedy(80))],
        6: [("j4", prompt(QUESTIONS[9]), greedy(30))],
        9: [("j5", prompt(QUESTIONS[6]), greedy(70))],
    }
    results["join"] = run(schedule, {8: ["j3"]})
    # 3. A request that runs into the model's length limit: its answer stops there, drafts included.
    long_question = "Repeat after me: " + " ".join(["the quick brown fox jumps over the lazy dog"] * 14)
    long_prompt = prompt(long_question)
    results["long_prompt_tokens"] = len(long_prompt)
    results["limit"] = run({0: [("l0", long_prompt, greedy(MAX_MODEL_LEN))]}, {})
    # 4. A prompt longer than the limit is refused by vLLM, and the engine keeps serving.
    try:
        engine.add_request("t0", {"prompt_token_ids": prompt(long_question * 3)}, greedy(8))
        results["too_long"] = "accepted"
    except VLLMClientError as error:
        results["too_long"] = f"refused: {type(error).__name__}: {str(error)[:160]}"
    results["after"] = run({0: [("a0", prompt(QUESTIONS[2]), greedy(24))]}, {})
    # 5. Seeded sampling: 160 answers of 4 tokens to one question at temperature 1.
    question = prompt(QUESTIONS[6])
    sampled = [(f"s{i}", question, SamplingParams(temperature=1.0, max_tokens=4, seed=i)) for i in range(160)]
    results["sampled"] = run({0: sampled}, {})
    # 6. One more request: the engine tells the runner which requests finished at its next step.
    results["last"] = run({0: [("z0", prompt(QUESTIONS[1]), greedy(6))]}, {})
    if args.method == "recap":
        drafter = engine.model_executor.driver_worker.worker.model_runner.drafter
        stats = drafter.stats
        results["proposer"] = {
            "running": sorted(drafter.requests), "passes": stats.passes, "proposed": stats.proposed,
            "accepted": stats.accepted, "memory_tokens": len(drafter.persistent),
        }  # fmt: skip
    Path(args.out).write_text(json.dumps(results))


def ngrams(tokens: list[int]) -> set[tuple[int, ...]]:
    """Every run of 2 and 3 consecutive tokens: the keys of the contextual memories."""
    return {tuple(tokens[i : i + n]) for n in (2, 3) for i in range(len(tokens) - n + 1)}


def scene_prompts(template, count: int) -> list[tuple[str, object]]:
    """The first ``count`` scenes of ``scenes2``: the chat template's text (the image, then the question,
    as this project's engine builds it, ``template`` applying it) and the image."""
    from recap.bench.datasets import load_dataset  # only once vLLM's engine runs (numba; docs/vllm.md)

    prompts = []
    for sample in load_dataset("scenes2", limit=count):
        content = [{"type": "image"}, {"type": "text", "text": sample.prompt}]
        text = template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
        prompts.append((text, sample.images[0]))
    return prompts


def reference(args: argparse.Namespace) -> None:
    """The vision scenario's scenes answered by transformers' own ``generate`` (greedy, float32, one at a
    time): the model code this project's engine runs, without vLLM."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(args.model)
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32).eval()
    outputs = {}
    for index, (text, image) in enumerate(scene_prompts(processor.apply_chat_template, args.scenes)):
        inputs = processor(text=[text], images=[image], return_tensors="pt")
        with torch.inference_mode():
            ids = model.generate(**inputs, max_new_tokens=SCENE_TOKENS, do_sample=False)[0].tolist()
        length = inputs["input_ids"].shape[1]
        outputs[f"v{index}"] = {"prompt": ids[:length], "tokens": ids[length:]}
    Path(args.out).write_text(json.dumps({"outputs": outputs}))


def vision(args: argparse.Namespace) -> None:
    """Scenes of ``scenes2`` with their images, all at once, in vLLM's Transformers backend (vLLM's
    own LLaVA imports torchvision). Each request's tokens; with RECAP, after every engine step, each
    running request's 2- and 3-token memory keys that are not runs of its own tokens (its prompt, its
    answer so far, the chains it proposed: what its passes verified) or that hold a placeholder id, and
    the steps at which running requests shared a contextual memory."""
    from vllm import LLM, SamplingParams

    from scripts.vllm_bench import speculative_config

    llm = LLM(
        args.model, model_impl="transformers", dtype="float32", enforce_eager=True, seed=0,
        max_model_len=MAX_MODEL_LEN, max_num_seqs=16, limit_mm_per_prompt={"image": 1},
        speculative_config=speculative_config(args.method, K),
    )  # fmt: skip
    engine, template = llm.llm_engine, llm.get_tokenizer().apply_chat_template
    for index, (text, image) in enumerate(scene_prompts(template, args.scenes)):
        request = {"prompt": text, "multi_modal_data": {"image": image}}
        engine.add_request(f"v{index}", request, SamplingParams(temperature=0.0, max_tokens=SCENE_TOKENS))
    runner = engine.model_executor.driver_worker.worker.model_runner
    proposer = getattr(runner, "drafter", None) if args.method.startswith("recap") else None
    outputs: dict[str, dict] = {}
    allowed: dict[str, set] = defaultdict(set)
    foreign: dict[str, set] = defaultdict(set)
    placeholders, keys, shared, most_running = set(), 0, 0, 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id] = {
                "prompt": list(output.prompt_token_ids), "tokens": list(output.outputs[0].token_ids),
            }  # fmt: skip
        if proposer is None:
            continue
        most_running = max(most_running, len(proposer.requests))
        drafters = [running.drafter for running in proposer.requests.values()]
        shared += len({id(d.ctx2) for d in drafters} | {id(d.ctx3) for d in drafters}) < 2 * len(drafters)
        for internal, running in proposer.requests.items():
            req_id = internal.rsplit("-", 1)[0]  # (vLLM adds a suffix to the ids it is given)
            own = outputs[req_id]["prompt"] + outputs[req_id]["tokens"]
            allowed[req_id] |= ngrams(own + [int(t) for t in running.proposed.tokens])
            drafter = running.drafter
            found = {tuple(int(t) for t in key) for key in drafter.ctx2.keys() + drafter.ctx3.keys()}
            keys = max(keys, len(found))
            foreign[req_id] |= found - allowed[req_id]
            placeholders |= {key for key in found if set(key) & proposer.excluded}
    results: dict[str, object] = {"outputs": outputs}
    if proposer is not None:
        results["proposer"] = {
            "excluded": sorted(proposer.excluded), "accepted": proposer.stats.accepted,
            "passes": proposer.stats.passes, "most_keys": keys, "most_running": most_running,
            "shared_steps": shared, "foreign": {r: sorted(k) for r, k in foreign.items() if k},
            "placeholder_keys": sorted(placeholders),
        }  # fmt: skip
    Path(args.out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
