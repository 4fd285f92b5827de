"""Every scenario the vLLM tests compare, run in one engine with one speculative method.

    python tests/in_vllm/scenario.py --method recap --model runs/models/smollm2-135m-instruct --out out.json

vLLM's engine owns its process, so each method runs in a subprocess of its own (`tests/in_vllm/conftest.py`)
and the tests compare the JSON files: the token ids of every request of every scenario, the errors the
engine answered, and (RECAP) what the proposer holds at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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
    args = parser.parse_args()

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


if __name__ == "__main__":
    main()
