"""The vLLM tests run in vLLM's own environment (`bash scripts/install_vllm.sh`, then
``.venv-vllm/bin/python -m pytest tests/in_vllm``); elsewhere they are skipped, with that command as the
reason. Each engine runs `scenario.py` in a subprocess of its own (vLLM's engine owns its process)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The model the tests serve: SmolLM2-135M-Instruct as a folder (`python -m scripts.vllm_model`).
MODEL = Path(os.environ.get("RECAP_VLLM_TEST_MODEL", ROOT / "runs/models/smollm2-135m-instruct"))
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config, items):
    if HAS_VLLM:
        return
    skip = pytest.mark.skip(
        reason="vLLM is not installed here: bash scripts/install_vllm.sh, then "
        ".venv-vllm/bin/python -m pytest tests/in_vllm"
    )
    for item in items:
        if "tests/in_vllm/" in item.nodeid:
            item.add_marker(skip)


def run_scenario(
    method: str, out: Path, model: Path = MODEL, extra: tuple[str, ...] = (), env: dict | None = None
) -> dict:
    """Every scenario of `scenario.py` in one engine with ``method``; its JSON results. ``extra``: more
    arguments of `scenario.py`; ``env``: environment variables set for it."""
    if not (model / "config.json").exists():
        pytest.fail(f"the test model is missing: python -m scripts.vllm_model --out {model}")
    script = str(ROOT / "tests/in_vllm/scenario.py")
    command = [sys.executable, script, "--method", method, "--model", str(model), "--out", str(out), *extra]
    environment = {**os.environ, **(env or {})}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT, env=environment)
    if done.returncode != 0:
        pytest.fail(f"the {method} engine failed:\n{done.stderr[-4000:]}")
    return json.loads(out.read_text())


@pytest.fixture(scope="session")
def scenarios(tmp_path_factory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("vllm")
    return {method: run_scenario(method, folder / f"{method}.json") for method in ("none", "recap")}
