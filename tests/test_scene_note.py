"""The Run tab's note for a photo given to an embedded model (`recap.studio.ui.scene_note`): its words,
and a run over the API that carries it in every status from the first step on, while a scene's run has
none."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import free_port
from PIL import Image

from recap.runtime import EMBEDDED_MODEL_V1, EMBEDDED_MODEL_V2
from recap.studio.environment import EMBEDDED_V1_ID, EMBEDDED_V2_ID, PAPER_MODELS
from recap.studio.ui.examples import examples
from recap.studio.ui.render import markdown_text
from recap.studio.ui.scene_note import photo_advice, scene_note, with_note

BOTH = (EMBEDDED_MODEL_V1 / "config.json").is_file() and (EMBEDDED_MODEL_V2 / "config.json").is_file()
needs_both = pytest.mark.skipif(not BOTH, reason="the embedded models are not both in assets/models")
NOTE = "Note: this image does not look like a drawn scene of coloured shapes"
#: Output position of the status in /run's outputs (the client leaves out the Download button).
STATUS = 7


def _photo() -> Image.Image:
    """A real photo: scikit-image's cat (the issue's photo), else noise (a photo's colours, no shapes)."""
    try:
        from skimage import data
    except ImportError:
        return Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 451, 3), dtype=np.uint8))
    return Image.fromarray(data.chelsea())


# ------------------------------------------------------------------------------------------ words
@needs_both
@pytest.mark.parametrize("model_id", [EMBEDDED_V2_ID, EMBEDDED_V1_ID])
def test_an_embedded_model_gets_the_note_for_a_photo_and_none_for_its_scenes(model_id):
    note = scene_note(model_id, _photo(), [EMBEDDED_V2_ID, EMBEDDED_V1_ID])
    assert note is not None and note.startswith(f"**{NOTE}**")
    assert "only thing Embedded VLM" in note and "as if it were one" in note
    assert "this server offers none" in note  # no real VLM offered on this CPU server
    for path, _ in examples(model_id):
        assert scene_note(model_id, Image.open(path).convert("RGB"), [model_id]) is None, path
    assert scene_note(model_id, None, [model_id]) is None  # (a run without an image)


def test_a_model_that_is_not_embedded_gets_no_note():
    assert scene_note("tiny-llava", _photo(), ["tiny-llava"]) is None
    assert scene_note(PAPER_MODELS[0], _photo(), [PAPER_MODELS[0]]) is None


def test_the_advice_names_what_this_server_offers_for_photos():
    """(Names are shown literally in the Markdown status: `markdown_text` escapes their punctuation.)"""
    on_gpu = photo_advice([EMBEDDED_V2_ID, EMBEDDED_V1_ID, *PAPER_MODELS])
    assert on_gpu == f"For photos, pick {markdown_text(PAPER_MODELS[0])} in Model: a real VLM."
    own = photo_advice([EMBEDDED_V2_ID, "my-org/my_vlm"])
    assert own == f"For photos, pick another model in Model ({markdown_text('my-org/my_vlm')})."
    none = photo_advice([EMBEDDED_V2_ID, EMBEDDED_V1_ID])
    assert "Qwen" in none and "on a server with a GPU" in none and "SmolVLM" in none and "offers none" in none
    assert with_note("Done.", None) == "Done." and with_note("Done.", "A note.") == "Done.\n\nA note."


# ------------------------------------------------------------------------------------------ the API
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A studio serving both embedded models (the studio's own loader), and a photo on disk."""
    from gradio_client import Client

    import app

    if not BOTH:
        pytest.skip("the embedded models are not both in assets/models")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_TEMP_DIR", str(tmp_path_factory.mktemp("gradio")))
        demo = app.build_demo(models=[EMBEDDED_V2_ID, EMBEDDED_V1_ID])
        port = free_port()
        demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        photo = tmp_path_factory.mktemp("inputs") / "cat.png"
        _photo().save(photo)
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        yield SimpleNamespace(client=client, photo=photo)
        client.close()
        demo.close()


def _statuses(client, image: Path, prompt: str, model: str) -> list[str]:
    """Every status /run shows for ``prompt`` about ``image`` (greedy, 16 tokens, no display delay)."""
    from gradio_client import handle_file

    values = [handle_file(str(image)), prompt, model, "recap", "fixed", 8, 8, 8, True, True, True, 16]
    job = client.submit(*values, "per session", 0.0, 0, 1.0, None, 0, api_name="/run")
    list(job)
    return [update[STATUS] for update in job.outputs() if isinstance(update[STATUS], str) and update[STATUS]]


@pytest.mark.parametrize("model_id", [EMBEDDED_V2_ID, EMBEDDED_V1_ID])
def test_a_run_on_a_photo_carries_the_note_in_every_status_and_a_scenes_run_none(served, model_id):
    statuses = _statuses(served.client, served.photo, "What animal is in this photo?", model_id)
    shown = [s for s in statuses if not s.startswith("Loading")]
    assert shown and shown[-1].startswith("Done:"), statuses
    assert all(NOTE in s for s in shown), statuses  # from "Generating…" on, the Done status too
    scene, prompt = examples(model_id)[0]
    statuses = _statuses(served.client, Path(scene), prompt, model_id)
    assert statuses[-1].startswith("Done:") and not [s for s in statuses if NOTE in s], statuses
