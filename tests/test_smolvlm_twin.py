"""The real VLM a server without a GPU offers when it reaches the hub (SmolVLM-256M-Instruct): when it is
offered, how it loads, and the studio's Run, Compare and Sensitivity flows on it with the shipped photos.

No hub here: the model is a tiny random twin saved as its hub repository is laid out (its published
architecture and processor, the sizes shrunk: `tiny_models.save_smolvlm_twin`), named by
``RECAP_CPU_HUB_MODEL`` and loaded by the studio's own loader, the path a hub id takes once downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
import torch
from conftest import free_port, reference_greedy
from tiny_models import SMOLVLM_ID, save_smolvlm_twin

from recap.decode import generate
from recap.inputs import load_image
from recap.runtime import Runtime
from recap.studio import environment
from recap.studio.environment import (
    CPU_HUB_MODEL,
    EMBEDDED_V1_ID,
    EMBEDDED_V2_ID,
    PAPER_MODELS,
    default_runtime_factory,
    memory_plan,
    offered_models,
)
from recap.studio.serving import RuntimeCache
from recap.studio.ui import measure
from recap.studio.ui.examples import OTHER_SET, PHOTOS_DIR, example_sets, photo_examples

PHOTOS = ["chelsea.jpg", "coffee.jpg", "rocket.jpg"]


@pytest.fixture(scope="module")
def twin(tmp_path_factory) -> Path:
    return save_smolvlm_twin(tmp_path_factory.mktemp("smolvlm-256m-twin"))


@pytest.fixture
def clean_env(monkeypatch):
    """No operator setting that changes the offered models; the hub cache empty; a CPU."""
    for name in ("RECAP_MODEL", "RECAP_MODELS", "RECAP_CPU_HUB_MODEL", "RECAP_OFFLINE", "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return monkeypatch


# ------------------------------------------------------------------------------------ offered
EMBEDDED = [EMBEDDED_V2_ID, EMBEDDED_V1_ID]


@pytest.mark.parametrize(
    "gpu, env, hub_answers, cached, offered",
    [
        (False, {}, True, False, [*EMBEDDED, CPU_HUB_MODEL]),  # a CPU that reaches the hub
        (False, {}, False, False, EMBEDDED),  # no answer from the hub: offline in fact
        (False, {"RECAP_OFFLINE": "1"}, True, False, EMBEDDED),  # offline: the hub is never asked
        (False, {"RECAP_OFFLINE": "1"}, None, True, [*EMBEDDED, CPU_HUB_MODEL]),  # offline, in the cache
        (False, {"SPACE_ID": "org/space"}, None, False, [*EMBEDDED, CPU_HUB_MODEL]),  # a Space: not asked
        (False, {"RECAP_CPU_HUB_MODEL": "off"}, None, False, EMBEDDED),
        (False, {"RECAP_CPU_HUB_MODEL": "org/other-vlm"}, True, False, [*EMBEDDED, "org/other-vlm"]),
        (False, {"RECAP_CPU_HUB_MODEL": "/no/such/folder"}, None, False, EMBEDDED),  # never asks the hub
        (True, {}, None, False, [*EMBEDDED, *PAPER_MODELS]),  # a GPU: the paper's models instead
    ],
)  # fmt: skip
def test_a_cpu_offers_the_hub_model_only_where_it_reaches_the_hub(
    clean_env, gpu, env, hub_answers, cached, offered
):
    clean_env.setattr(torch.cuda, "is_available", lambda: gpu)
    for name, value in env.items():
        clean_env.setenv(name, value)
    if cached:
        clean_env.setattr(
            huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: "/cache/config.json"
        )

    def answers(url: str) -> bool:
        assert hub_answers is not None, f"the hub was asked ({url})"
        assert url.endswith(f"/api/models/{offered[-1] if hub_answers else CPU_HUB_MODEL}")
        return hub_answers

    clean_env.setattr(environment, "_hub_answers", answers)
    assert offered_models() == offered  # the default stays the embedded model v2
    warm = memory_plan(offered).warmup_s
    assert warm == (60.0 if gpu or offered[-1] in (CPU_HUB_MODEL, "org/other-vlm") else 0.0)


def test_the_hub_model_has_a_name_for_visitors_and_photo_examples_first():
    assert environment.model_label(CPU_HUB_MODEL) == "SmolVLM-256M (real photos, CPU)"
    assert [Path(p).name for p, _ in photo_examples()] == PHOTOS
    sets = example_sets([*EMBEDDED, CPU_HUB_MODEL])
    assert list(sets) == [*EMBEDDED, OTHER_SET] and sets[OTHER_SET][:3] == photo_examples()
    listed = json.loads((PHOTOS_DIR / "prompts.json").read_text(encoding="utf-8"))
    assert all(e["source"] == f"skimage.data.{Path(e['image']).stem}" for e in listed)
    assert all((PHOTOS_DIR / name).stat().st_size < 200_000 for name in PHOTOS)
    assert "CC0" in (PHOTOS_DIR / "README.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------ the twin
def test_the_twin_keeps_the_published_architecture_processor_and_chat_template(twin):
    config = json.loads((twin / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    assert (config["model_type"], config["scale_factor"]) == ("idefics3", 4)
    assert config["vision_config"]["patch_size"] == 16 and config["text_config"]["model_type"] == "llama"
    image = json.loads((twin / "preprocessor_config.json").read_text(encoding="utf-8"))
    assert image["image_processor_type"] == "Idefics3ImageProcessor" and image["do_image_splitting"]
    assert image["size"]["longest_edge"] == 4 * image["max_image_size"]["longest_edge"]
    assert json.loads((twin / "processor_config.json").read_text(encoding="utf-8"))["image_seq_len"] == 4
    assert (twin / "chat_template.json").is_file()
    assert SMOLVLM_ID == CPU_HUB_MODEL


def test_the_loader_makes_a_photo_one_tile_and_recap_stays_lossless(clean_env, twin):
    clean_env.setenv("RECAP_CPU_HUB_MODEL", str(twin))
    target = default_runtime_factory(str(twin)).target
    split = Runtime.load(str(twin)).target  # as the repository says: split into tiles
    photo, prompt = photo_examples()[0]
    image = load_image(photo)
    ids = {
        name: t.prepare([image], prompt)["input_ids"][0] for name, t in (("one", target), ("split", split))
    }
    image_id = target.model.config.image_token_id
    assert {name: int((row == image_id).sum()) for name, row in ids.items()} == {"one": 4, "split": 13 * 4}
    text = target.tokenizer.decode(ids["one"])  # (4 x 3 tiles of 128 pixels and the whole image, split)
    assert text.startswith("<|im_start|>User:<fake_token_around_image><global-img><image>")
    assert text.endswith(f"{prompt}<end_of_utterance>\nAssistant:")
    runtime = Runtime(target)
    result = generate(target, runtime.drafter("recap", budget=8), prompt, [image], 24)
    assert result.tokens == reference_greedy(target, prompt, [image], 24)


# ----------------------------------------------------------------------------- the studio's flows
@pytest.fixture(scope="module")
def served(twin, tmp_path_factory):
    """The studio as a CPU server offers it with the twin as its hub model, served on 127.0.0.1."""
    from gradio_client import Client

    import app

    with pytest.MonkeyPatch.context() as patch:
        for name in ("RECAP_MODEL", "RECAP_MODELS", "RECAP_WARMUP_S", "RECAP_MEMORY"):
            patch.delenv(name, raising=False)
        patch.setenv("RECAP_CPU_HUB_MODEL", str(twin))
        patch.setenv("GRADIO_TEMP_DIR", str(tmp_path_factory.mktemp("gradio")))
        patch.setattr(torch.cuda, "is_available", lambda: False)
        demo = app.build_demo(cache=RuntimeCache())  # the studio's own loader and models
        port = free_port()
        demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        yield SimpleNamespace(client=client, demo=demo, model=str(twin))
        client.close()
        demo.close()


def _args(model: str, method: str = "recap", max_new: int = 16) -> list:
    """The Run endpoint's inputs: the first photo example, a fixed budget of 8 nodes, greedy."""
    from gradio_client import handle_file

    photo, prompt = photo_examples()[0]
    settings = [method, "fixed", 8, 8, 8, True, True, True, max_new, "per session", 0.0, 0, 1.0, None, 0]
    return [handle_file(photo), prompt, model, *settings]


def test_choosing_the_hub_model_shows_its_photos(served):
    assert served.demo.studio.models == [*EMBEDDED, served.model]
    follow = next(fn for fn in served.demo.fns.values() if fn.fn is not None and fn.fn.__name__ == "follow")
    updates = follow.fn(served.model, None, "")
    shown = {value["value"]["orig_name"] if isinstance(value["value"], dict) else value["value"]
             for value in updates.values() if "value" in value}  # fmt: skip
    assert shown == {PHOTOS[0], photo_examples()[0][1]}


def test_run_compare_and_sensitivity_work_on_the_hub_models_twin(served):
    from recap.trace import RunTrace

    client, studio = served.client, served.demo.studio
    answers = {}
    for method in ("recap", "ar"):  # Run: RECAP streams the tokens AR gives
        job = client.submit(*_args(served.model, method), api_name="/run")
        updates = list(job)
        assert job.outputs()[-1][7].startswith("Done"), job.outputs()[-1][7]
        answers[method] = RunTrace.load(client.predict(api_name="/download"))
    assert len(updates) >= 2 and answers["recap"].tokens == answers["ar"].tokens
    assert len(answers["recap"].steps) < len(answers["ar"].steps)  # drafts accepted: fewer passes
    # loaded once: its cost curve measured, its memory warmed on the photos first
    runtime = studio.cache.loaded(served.model)
    assert runtime.measured_cost() is not None
    assert studio.cache.start(served.model).origin == "warm-up"
    labels = [r.label for r in studio.warmup_requests(runtime)]
    assert labels[:3] == [f"example {name}" for name in PHOTOS]
    # Compare: every method, each identical to AR
    status, table, _story, _strip = client.predict(
        *_args(served.model)[:-1], measure.EQUAL, api_name="/compare"
    )
    rows = table["data"] if isinstance(table, dict) else table
    assert rows and all(r[measure.HEADERS.index("identical to AR")] == "yes" for r in rows), status
    # Sensitivity: the compared runs' tokens that depend on the photo
    _answer, sens_table, sens_status = client.predict("blank (grey)", api_name="/sensitivity")
    assert "image-sensitive" in sens_status and "Analysed: the last comparison's runs" in sens_status
    assert len(sens_table["data"] if isinstance(sens_table, dict) else sens_table) == len(rows)
