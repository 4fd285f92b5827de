"""Serving many visitors at once: the shared model cache, one target pass at a time per model, and
each visitor's own memories.

- `RuntimeCache` loads each model once (concurrent first requests wait for it) and holds a lock per
  model, taken around each target pass only, so the passes of concurrent visitors interleave.
- `Studio` is what every request shares (model factory, cache, offered models and memory scopes, the
  folders an image may come from); it validates a request (`check_request`, `prepare`) and streams
  its steps (`stream`).
- `session_memories` / `drafter_for`: a visitor's drafting state (`recap.state.DrafterState`: the
  persistent memory, Token Recycling's matrix, SuffixDecoding's tree) lives in their ``gr.State`` (per
  browser session); the process-wide one only when the operator offers that scope. Every scope starts
  from its own copy of the model's starting memory (`recap.hotstart`: the shipped memory of an
  embedded model, ``RECAP_MEMORY``, or a warm-up at load). States are kept by model id, so each model
  (v1, v2, a hub model) has its own and tokenizers never mix.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from recap.decode import Details, Generation, StepObserver, decode
from recap.drafters.recap.config import RecapConfig
from recap.drafters.suffix_decoding import SuffixConfig, SuffixTreeCache
from recap.embedded import embedded_world, training_requests
from recap.hotstart import (
    EMPTY_START,
    StartingMemory,
    shipped_start,
    starting_memory,
    warm_start,
)
from recap.inputs import check_prompt, shown
from recap.runtime import Runtime
from recap.sampling import GREEDY, SamplingSettings
from recap.state import DrafterState
from recap.studio.environment import (
    REPLAY_CONCURRENCY,
    REPLAY_SHARE,
    SESSION_SCOPE,
    MemoryPlan,
    concurrency,
    displays,
    per_client,
    proxy_hops,
    session_budget,
    turn_s,
    waiting,
)
from recap.studio.guard.clients import client_key
from recap.studio.guard.decode_line import Busy, DecodeSlots, WaitingLine
from recap.studio.guard.jobs import Cancelled, DecodeJob, SessionJobs
from recap.studio.guard.offload import DrawingWorker
from recap.studio.guard.sessions import ClientLedger
from recap.studio.guard.tickets import RenderBudget, Tickets
from recap.studio.guard.validation import (
    RunSettings,
    check_model,
    parse_settings,
    read_image,
    refusal,
    uploaded_path,
)
from recap.studio.ui.examples import EXAMPLE_ROOTS, OTHER_SET, example_requests, examples, photo_examples
from recap.trace import StepRecord

log = logging.getLogger("recap.studio")

RuntimeFactory = Callable[[str], Runtime]
#: The part of one CPU that the paced displays of all runs share for their updates (`RenderBudget`).
DISPLAY_SHARE = 0.25
#: How long drawing from a stored trace waits for running decodes to end (`Studio.give_way`).
GIVE_WAY_S = 3.0
#: ``(model id, loaded runtime) -> where its memories start``.
StartFactory = Callable[[str, Runtime], StartingMemory]


class RuntimeCache:
    """Loaded models, shared by all visitors: each loads once (concurrent first requests wait for it),
    and each has a lock so that one target pass runs at a time per model. With each model, its
    starting memory (`recap.hotstart.StartingMemory`) and the process-wide memories made from it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runtimes: dict[str, Runtime] = {}
        self._loading: dict[str, threading.Lock] = {}
        self._passes: dict[str, threading.Lock] = {}
        self._starts: dict[str, StartingMemory] = {}
        self._shared: dict[str, DrafterState] = {}

    def loaded(self, model_id: str) -> Runtime | None:
        with self._lock:
            return self._runtimes.get(model_id)

    def get(self, model_id: str, factory: RuntimeFactory, prepare: StartFactory | None = None) -> Runtime:
        """The runtime of ``model_id``, loading it with ``factory`` on first use (ValueError if it can't);
        ``prepare(model_id, runtime)`` then gives its starting memory (before anyone can use it)."""
        with self._lock:
            loading = self._loading.setdefault(model_id, threading.Lock())
        with loading:
            runtime = self.loaded(model_id)
            if runtime is None:
                start = time.perf_counter()
                runtime = factory(model_id)
                log.info("loaded %s in %.1f s", model_id, time.perf_counter() - start)
                starting = prepare(model_id, runtime) if prepare is not None else EMPTY_START
                with self._lock:
                    self._runtimes[model_id] = runtime
                    self._passes[model_id] = threading.Lock()
                    self._starts[model_id] = starting
            return runtime

    def start(self, model_id: str) -> StartingMemory:
        """Where ``model_id``'s memories start (empty before it is loaded, or when nothing was given)."""
        with self._lock:
            return self._starts.get(model_id, EMPTY_START)

    def shared_memories(self, model_id: str, vocab_size: int) -> DrafterState:
        """The process-wide drafting state of ``model_id`` (every visitor who chose that scope), made
        from its starting memory on first use."""
        start = self.start(model_id)
        with self._lock:
            return session_memories(self._shared, model_id, vocab_size, start)

    def peek_shared(self, model_id: str) -> DrafterState | None:
        """The process-wide memories of ``model_id`` if a visitor has used them yet (never creates them)."""
        with self._lock:
            return self._shared.get(model_id)

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
def decode_steps(runtime: Runtime, drafter, generation: Generation, observers: Sequence[StepObserver] = ()):
    """The GPU-bound generator: `recap.decode.decode` on ``runtime``'s model with `Details` (the display
    fields) and then ``observers`` (the Compare tab's probe); yields picklable StepRecords."""
    yield from decode(runtime.target, drafter, generation, (Details(runtime.target), *observers))


#: What a session holds for a model whose memories the visitor emptied before the model was loaded.
EMPTIED = "empty"


def session_memories(
    session: dict, model_id: str, vocab_size: int, start: StartingMemory = EMPTY_START
) -> DrafterState:
    """A scope's drafting state for ``model_id``: created on first use from ``start``, or empty after
    "Reset: empty" (`EMPTIED`)."""
    state = session.get(model_id)
    if isinstance(state, DrafterState) and state.vocab_size == vocab_size:
        return state
    if state == EMPTIED:
        state = DrafterState(vocab_size, EMPTY_START, cleared=True)
    else:
        state = DrafterState(vocab_size, start)
    session[model_id] = state
    return state


def scope_memories(
    cache: RuntimeCache, runtime: Runtime, settings: RunSettings, session: dict
) -> DrafterState:
    """The drafting state of the visitor's chosen scope: their session's own, or the process-wide one."""
    vocab = runtime.target.vocab_size
    if settings.scope == SESSION_SCOPE:
        return session_memories(session, settings.model, vocab, cache.start(settings.model))
    return cache.shared_memories(settings.model, vocab)


def drafter_for(
    runtime: Runtime,
    settings: RunSettings,
    method: str,
    config: RecapConfig,
    session: dict,
    cache: RuntimeCache | None = None,
):
    """A drafter whose memories follow the chosen scope (`scope_memories`): this session's own (the
    default), or the process-wide ones every visitor shares (only when the operator offers that scope).
    Both start from the model's starting memory.

    A drafter that cannot be built here (SuffixDecoding without its package) is refused with the
    reason, which names the install command.
    """
    state = scope_memories(cache or CACHE, runtime, settings, session)
    try:  # (SuffixDecoding's tree holds this scope's answers only; created on first use)
        return runtime.drafter(method, config=config, state=state)
    except ValueError as error:
        raise refusal(str(error)) from None


def fresh_drafter(
    runtime: Runtime, method: str, config: RecapConfig, suffix_config: SuffixConfig | None = None
):
    """A drafter with fresh, empty memories of its own (the Compare tab warms them itself, then copies it:
    SuffixDecoding's cache is replayable); ``suffix_config``: its settings (its tree's depth and size too)."""
    try:
        suffix = suffix_config or SuffixConfig()
        own = SuffixTreeCache.for_config(suffix, replayable=True) if method == "suffix" else None
        state = DrafterState.given(runtime.target.vocab_size, suffix_cache=own, suffix_config=suffix_config)
        return runtime.drafter(method, config=config, state=state)
    except ValueError as error:
        raise refusal(str(error)) from None


#: Requests the Compare tab warms every method with memories on (`Studio.compare_warmup`).
COMPARE_WARMUP = 8


#: The drawing worker every studio of this process shares (started on its first drawing).
DRAWING = DrawingWorker(modules=("recap.studio.ui.handlers", "recap.studio.ui.traces"))


class Studio:
    """What every visitor's requests share: the model factory and cache, the offered models and memory
    scopes, the folders an image may come from, and the bounds that keep one visitor from taking the
    server: the decode slots and their line, fair across clients and bounded per client (`slots`,
    `submit`), one job per session and event (`jobs`), the paced displays and their CPU (`displays`,
    `updates`), the sessions' memory budget (`sessions`; `recap.studio.environment` reads them).
    Per-visitor data is in gr.State."""

    def __init__(
        self,
        runtime_factory: RuntimeFactory,
        models: list[str],
        cache: RuntimeCache = CACHE,
        scopes: tuple[str, ...] = (SESSION_SCOPE,),
        plan: MemoryPlan | None = None,
    ) -> None:
        self.factory = runtime_factory
        self.models = list(models)
        self.cache = cache
        self.scopes = scopes
        self.plan = plan or MemoryPlan()
        #: Requests every compared method is warmed on before its timed run (`Studio.warmup_requests`).
        self.compare_warmup = COMPARE_WARMUP
        #: Folders an image may come from: gradio's upload cache (set by `build_demo`) and the examples.
        self.upload_roots: list[Path] = list(EXAMPLE_ROOTS)
        self.page_defaults: list = []  # the setting inputs' defaults, in order (set by `build_demo`)
        self.slots = DecodeSlots(concurrency(), waiting(), per_client(), turn_s())
        self.proxy_hops = proxy_hops()
        self.jobs = SessionJobs()
        # paced displays at once, in all and per client (a run's handler lives as long as its display)
        self.displays = Tickets(displays(), per_client())
        # replays read at once, one per client, a client's at most half of the time back to back: more
        # are refused at once, never queued behind them
        self.replays = Tickets(REPLAY_CONCURRENCY, 1, share=REPLAY_SHARE)
        # what those tickets draw, drawn in a worker process at a low priority (one for the process)
        self.drawing = DRAWING
        self.updates = RenderBudget(DISPLAY_SHARE)
        budget, sessions = session_budget()
        # each session's client (the last that sent its decoding work), at most twice the sessions kept
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._owners_kept, self._owners_lock = 2 * sessions, threading.Lock()
        self.sessions = ClientLedger(budget, sessions, busy=self.jobs.active, owner=self.owner)

    def give_way(self, limit_s: float = GIVE_WAY_S) -> None:
        """Wait while a decode runs, at most ``limit_s``: drawing from a stored trace (a replay, a step
        view, a download) comes after decoding. The server's threads share one interpreter lock, and a
        visitor's 32-token run took three times as long beside a replay's drawing."""
        end = time.monotonic() + limit_s
        while self.slots.counts()[0] and time.monotonic() < end:
            time.sleep(0.02)

    def client(self, request) -> str:
        """Who sent ``request`` (`recap.studio.guard.clients.client_key` behind `proxy_hops` proxies)."""
        return client_key(request, self.proxy_hops)

    def owner(self, session: str) -> str | None:
        """The client that last sent ``session``'s decoding work (None: it has sent none, or long ago)."""
        with self._owners_lock:
            return self._owners.get(session)

    def submit(self, request, event: str, work: Callable[[DecodeJob], object]) -> DecodeJob:
        """Queue ``work`` in the decode line for ``request``'s client, as its session's job of ``event``
        (which replaces the session's older one: that one is not counted against the client). A full
        line, or a client holding its share of it, is a refusal that says so."""
        session = request.session_hash if request is not None else None
        client = self.client(request)
        if session is not None:
            with self._owners_lock:
                self._owners[session] = client
                self._owners.move_to_end(session)
                while len(self._owners) > self._owners_kept:
                    self._owners.popitem(last=False)
        try:
            job = self.slots.submit(work, client, replacing=self.jobs.current(session, event))
        except Busy as busy:
            raise refusal(busy.message) from None
        self.jobs.replace(session, event, job)
        return job

    def waiting_line(self, job: DecodeJob) -> WaitingLine:
        """What a handler's status line says while ``job`` waits in a busy line for its first slot: the
        line's length, every visitor's work counted, nobody's named (`WaitingLine`)."""

        def describe() -> str | None:
            running, waiting = self.slots.counts()
            if not job.waiting or running + waiting <= self.slots.slots:
                return None
            return (
                f"Waiting for a decode slot: {running} decoding and {waiting} waiting, every visitor's work…"
            )

        return WaitingLine(describe)

    def in_flight(self, request, event: str) -> DecodeJob | None:
        """The job of ``event`` the caller's session has in flight (what its Stop acts on), or None."""
        return self.jobs.current(request.session_hash if request is not None else None, event)

    @contextlib.contextmanager
    def awaiting(self, request, event: str, job: DecodeJob, replaced: str) -> Iterator[None]:
        """Around a handler's wait for ``job`` (its session's job of ``event``, from `submit`): a job
        replaced by a newer one of the session ends in the refusal ``replaced``; whatever happens, the
        job is cancelled (its worker stops at its next step) and leaves the session's jobs."""
        try:
            yield
        except Cancelled as stop:
            if stop.args and stop.args[0] == "replaced":
                raise refusal(replaced) from None
            raise
        finally:
            job.cancel("ended")
            self.jobs.finish(request.session_hash if request is not None else None, event, job)

    def runtime(self, model_id: str) -> Runtime:
        try:
            return self.cache.get(model_id, self.factory, self.starting_memory)
        except ValueError as error:
            message = str(error)
            if not message.lower().startswith("cannot load model"):
                message = f"cannot load model {model_id!r}: {message}"
            raise refusal("C" + message[1:]) from None

    def starting_memory(self, model_id: str, runtime: Runtime) -> StartingMemory:
        """Where ``model_id``'s memories start (resolved once, when it loads): the operator's
        ``RECAP_MEMORY`` file, else the shipped memory of its folder, else a warm-up of
        ``RECAP_WARMUP_S`` seconds on the examples, else empty. A file that does not load is logged and
        gives an empty start."""
        target, vocab = runtime.target, runtime.target.vocab_size
        if model_id in self.plan.files:
            return starting_memory(target, self.plan.files[model_id], "file")
        shipped = shipped_start(target)
        if shipped.warm or shipped.note:  # a shipped memory exists (loaded, or refused with a reason)
            return shipped
        if self.plan.warmup_s > 0:
            log.info("warming %s's memory on the examples for up to %.0f s", model_id, self.plan.warmup_s)
            return warm_start(
                target,
                lambda memory: runtime.drafter("recap", state=DrafterState.given(vocab, persistent=memory)),
                self.warmup_requests(runtime),
                self.plan.warmup_s,
            )
        return EMPTY_START

    def warmup_requests(
        self, runtime: Runtime, exclude: tuple[str | None, str] | None = None, n: int = COMPARE_WARMUP
    ):
        """``n`` warm-up requests for ``runtime``'s model: training scenes of its world for an embedded
        model (v1's or v2's own distribution, never the held-out scenes of the examples), else the
        studio's examples (the photos too), leaving out ``exclude`` (image file, prompt)."""
        target = runtime.target
        world = embedded_world(target.name)
        if world is not None:
            return training_requests(world, n)
        requests = example_requests(examples(OTHER_SET) + photo_examples(), exclude)[:n]
        if target.family == "text":
            requests = [r._replace(images=()) for r in requests]
        return requests

    def warmup_source(self, runtime: Runtime) -> str:
        """Where `warmup_requests` come from, in words."""
        return "training scenes" if embedded_world(runtime.target.name) else "the studio's other examples"

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
        observers: Sequence[StepObserver] = (),
    ) -> Iterator[StepRecord]:
        """Steps of one generation (`decode_steps`); the model's pass lock is held during each pass only
        (interleaving)."""
        generation = Generation(prompt, images, max_new, method, sampling)
        lock = self.cache.pass_lock(model_id)
        steps = decode_steps(runtime, drafter, generation, observers)
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

    def known_model(self, model_id: object) -> str:
        """``model_id`` if this studio offers it (an old alias resolved), else a ``ValueError``."""
        return check_model(model_id, self.models)

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
