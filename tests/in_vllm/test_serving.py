"""vLLM's OpenAI-compatible server with RECAP (docs/vllm.md's command): a client's streamed chat answers
are the text the server gives without speculation."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from .conftest import MODEL, ROOT

pytestmark = pytest.mark.vllm

RECAP = '{"method": "custom_class", "model": "recap.vllm.RecapProposer", "num_speculative_tokens": 4}'
QUESTIONS = ("Write a short poem about the sea.", "List three uses of copper.", "Why is the sky blue?")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(speculative: str | None):
    """The server, as docs/vllm.md starts it; yields its port, then stops it."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(MODEL),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "1024",
        "--port",
        str(port),
    ]
    if speculative:
        command += ["--speculative-config", speculative]
    small = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    env = dict(os.environ, PYTHONPATH=str(ROOT), **small)
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the server stopped:\n{server.stderr.read().decode()[-3000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
            break
        except OSError:
            time.sleep(2)
    else:
        server.kill()
        pytest.fail("the server did not start in 600 s")
    return server, port


def streamed_answer(port: int, question: str) -> str:
    body = {"model": str(MODEL), "messages": [{"role": "user", "content": question}], "max_tokens": 64,
            "temperature": 0, "stream": True}  # fmt: skip
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    pieces = []
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                pieces.append(delta.get("content") or "")
    return "".join(pieces)


def answers(speculative: str | None) -> list[str]:
    server, port = serve(speculative)
    try:
        return [streamed_answer(port, question) for question in QUESTIONS]
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_a_streamed_answer_from_the_server_with_recap_is_the_plain_servers_text():
    plain, recap = answers(None), answers(RECAP)
    assert all(len(text) > 40 for text in plain)  # real answers, streamed in pieces
    assert recap == plain
