"""Serving many visitors at once: the shared model cache, one target pass at a time per model, and
each visitor's own memories.

- `RuntimeCache` loads each model once (concurrent first requests wait for it) and holds a lock per
  model, taken around each target pass only, so the passes of concurrent visitors interleave.
- `Studio` is what every request shares (model factory, cache, offered models and memory scopes, the
  folders an image may come from); it validates a request (`check_request`, `prepare`) and streams
  its steps (`stream`).
- `session_memories` / `drafter_for`: a visitor's persistent memory and Token Recycling matrix live
  in their ``gr.State`` (per browser session); the process-wide ones only when the operator offers
  that scope.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from recap.config import RecapConfig
from recap.decode import generate_steps
from recap.drafters.suffix_decoding import SuffixTreeCache, suffix_decoding_available
from recap.drafters.token_recycling import SuccessorMatrix
from recap.inputs import check_prompt, shown
from recap.memory import PersistentMemory
from recap.runtime import Runtime
from recap.sampling import GREEDY, SamplingSettings
from recap.studio.environment import SESSION_SCOPE
from recap.studio.examples import EXAMPLES_DIR
from recap.studio.validation import RunSettings, parse_settings, read_image, refusal, uploaded_path
from recap.trace import StepRecord

log = logging.getLogger("recap.studio")

RuntimeFactory = Callable[[str], Runtime]


class RuntimeCache:
    """Loaded models, shared by all visitors: each loads once (concurrent first requests wait for it),
    and each has a lock so that one target pass runs at a time per model.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runtimes: dict[str, Runtime] = {}
        self._loading: dict[str, threading.Lock] = {}
        self._passes: dict[str, threading.Lock] = {}

    def loaded(self, model_id: str) -> Runtime | None:
        with self._lock:
            return self._runtimes.get(model_id)

    def get(self, model_id: str, factory: RuntimeFactory) -> Runtime:
        """The runtime of ``model_id``, loading it with ``factory`` on first use (ValueError if it can't)."""
        with self._lock:
            loading = self._loading.setdefault(model_id, threading.Lock())
        with loading:
            runtime = self.loaded(model_id)
            if runtime is None:
                start = time.perf_counter()
                runtime = factory(model_id)
                log.info("loaded %s in %.1f s", model_id, time.perf_counter() - start)
                with self._lock:
                    self._runtimes[model_id] = runtime
                    self._passes[model_id] = threading.Lock()
            return runtime

    def pass_lock(self, model_id: str) -> threading.Lock:
        with self._lock:
            return self._passes.setdefault(model_id, threading.Lock())


#: The process's models, shared by every demo built in it.
CACHE = RuntimeCache()

try:  # ZeroGPU: a no-op decorator unless the Space runs on ZeroGPU hardware
    import spaces

    _gpu = spaces.GPU
except ImportError:  # pragma: no cover - depends on the host

    def _gpu(function):
        return function


@_gpu
def decode_steps(
    runtime: Runtime,
    drafter,
    prompt: str,
    images: list,
    max_new_tokens: int,
    method: str,
    sampling: SamplingSettings = GREEDY,
):
    """The GPU-bound generator: `generate_steps` on ``runtime``'s model (yields picklable StepRecords)."""
    yield from generate_steps(runtime.target, drafter, prompt, images, max_new_tokens, method, sampling)


def session_memories(session: dict, model_id: str, k: int, vocab_size: int) -> dict:
    """This session's persistent memory and Token Recycling matrix for ``model_id`` (created on first
    use; the persistent memory is renewed when k changes)."""
    memories = session.setdefault(model_id, {})
    if memories.get("k") != k:
        memories.update(k=k, persistent=PersistentMemory(vocab_size, k))
    memories.setdefault("successors", SuccessorMatrix(vocab_size))
    return memories


def drafter_for(runtime: Runtime, settings: RunSettings, method: str, config: RecapConfig, session: dict):
    """A drafter whose persistent memories follow the chosen scope: this session's own (the default),
    or the process-wide ones every visitor shares (only when the operator offers that scope).

    A drafter that cannot be built here (SuffixDecoding without its package) is refused with the
    reason, which names the install command.
    """
    persistent = successors = suffix_cache = None
    if settings.scope == SESSION_SCOPE:
        memories = session_memories(session, settings.model, config.k, runtime.target.vocab_size)
        persistent, successors = memories["persistent"], memories["successors"]
        if method == "suffix" and suffix_decoding_available():
            # Its global tree holds this session's answers only; created on first use (a C++ object).
            suffix_cache = memories.setdefault("suffix_cache", SuffixTreeCache())
    try:
        return runtime.drafter(
            method, config=config, persistent=persistent, successors=successors, suffix_cache=suffix_cache
        )
    except ValueError as error:
        raise refusal(str(error)) from None


class Studio:
    """What every visitor's requests share: the model factory and cache, the offered models and memory
    scopes, the folders an image may come from. Per-visitor data is in gr.State."""

    def __init__(
        self,
        runtime_factory: RuntimeFactory,
        models: list[str],
        cache: RuntimeCache = CACHE,
        scopes: tuple[str, ...] = (SESSION_SCOPE,),
    ) -> None:
        self.factory = runtime_factory
        self.models = list(models)
        self.cache = cache
        self.scopes = scopes
        #: Folders an image may come from: gradio's upload cache (set by `build_demo`) and the examples.
        self.upload_roots: list[Path] = [EXAMPLES_DIR]

    def runtime(self, model_id: str) -> Runtime:
        try:
            return self.cache.get(model_id, self.factory)
        except ValueError as error:
            message = str(error)
            if not message.lower().startswith("cannot load model"):
                message = f"cannot load model {model_id!r}: {message}"
            raise refusal("C" + message[1:]) from None

    def stream(
        self,
        runtime: Runtime,
        model_id: str,
        drafter,
        prompt: str,
        images: list,
        max_new: int,
        method: str,
        sampling: SamplingSettings = GREEDY,
    ) -> Iterator[StepRecord]:
        """Steps of one generation; the model's pass lock is held during each pass only (interleaving)."""
        lock = self.cache.pass_lock(model_id)
        steps = decode_steps(runtime, drafter, prompt, images, max_new, method, sampling)
        while True:
            with lock:
                try:
                    record = next(steps)
                except StopIteration:
                    return
                except ValueError as error:
                    raise refusal(str(error)) from None
                except Exception as error:  # keep serving: log the details, end this request only
                    log.exception("generation failed")
                    raise refusal(
                        f"Generation failed ({type(error).__name__}); the server log has the details."
                    ) from None
            yield record

    def settings(self, values) -> RunSettings:
        """`parse_settings` with this studio's models and scopes; a refusal for the visitor if bad."""
        try:
            return parse_settings(values, self.models, self.scopes)
        except ValueError as error:
            raise refusal(str(error)) from None

    def check_request(self, image, prompt, settings: RunSettings) -> tuple[Path | None, str, RecapConfig]:
        """Everything about a request that needs no model: ``(image file, prompt, drafter config)``."""
        try:
            if not isinstance(prompt, str):
                raise ValueError(f"the prompt must be text, got {shown(prompt)}")
            return uploaded_path(image, self.upload_roots), check_prompt(prompt), settings.config()
        except ValueError as error:
            raise refusal(str(error)) from None

    def prepare(self, image, prompt, settings: RunSettings):
        """Validate everything, then load the model: ``(runtime, config, prompt, images)``."""
        path, prompt, config = self.check_request(image, prompt, settings)
        runtime = self.runtime(settings.model)
        if config.k > runtime.target.vocab_size:
            raise refusal(f"k must be at most the model's vocabulary size ({runtime.target.vocab_size}).")
        image = read_image(path, needs_image=runtime.target.family != "text")
        return runtime, config, prompt, [image] if image is not None else []
