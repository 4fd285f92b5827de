"""The training batches in order, built in the training process or in spawned worker processes.

A batch is a pure function of its scene seeds (`training.data.batch_from_seeds`) and the seeds are
drawn here, in order, from the training run's generator: so a run is bit-identical whatever the number of
workers.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import replace

import torch

from training.data import WORLDS, SequenceBuilder, World, batch_from_seeds, draw_seeds

_WORKER: dict = {}


def _worker_init(world_name: str, overrides: dict, tokenizer, num_image_tokens: int, attn_scope: str) -> None:
    torch.set_num_threads(1)
    world = replace(WORLDS[world_name], **overrides)  # the run's world: its phrasings, noise and mix
    _WORKER.update(world=world, builder=SequenceBuilder(tokenizer, num_image_tokens), scope=attn_scope)


def _worker_batch(seeds: list[int]) -> dict:
    return batch_from_seeds(seeds, _WORKER["world"], _WORKER["builder"], _WORKER["scope"])


def _worker_loop(conn, init: tuple) -> None:
    """A batch worker: seeds in, batches out, in order, over its own pipe, until it reads ``None``."""
    _worker_init(*init)
    while (seeds := conn.recv()) is not None:
        conn.send(_worker_batch(seeds))


class BatchStream:
    """The training batches in order: seeds drawn here, batches built here (``workers == 0``) or in
    ``workers`` processes with ``prefetch`` batches in flight. Same batches either way.

    Each worker has a pipe of its own and batch ``i`` goes to worker ``i % workers``, so results come
    back in order with no lock shared between processes; a worker that dies raises here (with its exit
    code) instead of leaving the stream waiting. Workers are spawned, not forked: a forked child of a
    process whose threads (torch, tokenizers) held a lock can hang."""

    def __init__(
        self,
        rng,
        world: World,
        builder: SequenceBuilder,
        batch: int,
        attn_scope: str,
        workers: int = 0,
        prefetch: int = 4,
    ):
        self.rng, self.world, self.builder = rng, world, builder
        self.batch, self.scope, self.prefetch = batch, attn_scope, max(1, prefetch)
        self.workers: list = []  # (process, connection)
        self.pending: deque = deque()  # worker index of each batch in flight, oldest first
        self.sent = 0
        if workers > 0:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            ctx = multiprocessing.get_context("spawn")
            init = (world.name, world.overrides(), builder.tok)
            init += (builder.num_image_tokens, attn_scope)
            for _ in range(workers):
                here, there = ctx.Pipe()
                proc = ctx.Process(target=_worker_loop, args=(there, init), daemon=True)
                proc.start()
                there.close()
                self.workers.append((proc, here))

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        if not self.workers:
            return batch_from_seeds(draw_seeds(self.rng, self.batch), self.world, self.builder, self.scope)
        proc = None
        try:
            while len(self.pending) < self.prefetch:
                index = self.sent % len(self.workers)
                proc, conn = self.workers[index]
                conn.send(draw_seeds(self.rng, self.batch))
                self.pending.append(index)
                self.sent += 1
            proc, conn = self.workers[self.pending.popleft()]
            while not conn.poll(1.0):
                if not proc.is_alive():
                    raise EOFError
            return conn.recv()
        except (EOFError, OSError):  # the pipe closed, reset or broke: its worker is gone
            proc.join(timeout=2.0)
            self.close()
            raise RuntimeError(
                f"a batch worker died (exit code {proc.exitcode}); its error, if any, is above"
            ) from None

    def close(self) -> None:
        for _proc, conn in self.workers:
            with contextlib.suppress(OSError):  # the worker is gone already
                conn.send(None)
        for proc, conn in self.workers:
            proc.join(timeout=2.0)  # a worker still sending a batch nobody reads is stopped instead
            if proc.is_alive():
                proc.kill()
                proc.join()
            conn.close()
        self.workers, self.pending = [], deque()
