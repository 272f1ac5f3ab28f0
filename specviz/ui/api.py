"""The documented API endpoints for gradio_client: `/speculate` (DESIGN.md §5) and its
streaming twin `/speculate_stream`.

Boundary: (prompt, strategy, max_new_tokens, temperature, seed) -> (final text, contract
metrics). A chain strategy at its default settings joins the app's shared batch (batcher.py),
so concurrent callers share one batched target forward per step; any other strategy runs on its
own (at most session.SINGLE_RUNS at once). Errors are raised as gr.Error, which the client
receives as a clear message.
"""
from __future__ import annotations

import threading
from typing import Any, Iterator

import gradio as gr

from specviz import metrics
from specviz.batcher import Batcher
from specviz.events import RunFinished
from specviz.ui import session


def make(target, batcher: Batcher, gpu=lambda f: f):
    """The endpoint functions, bound to the loaded target and the shared batch."""

    def updates(prompt: str, strategy: str, max_new_tokens: int, temperature: float, seed: int,
                every_s: float) -> Iterator[tuple[str, dict[str, Any]]]:
        req = session.prepare(target, prompt=prompt, strategy=strategy,
                              max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        batched = batcher.batchable(req.strategy, req.settings)
        for events in session.stream(target, req, threading.Event(), every_s, batcher):
            fin = events[-1]
            m = (metrics.from_finished(fin) if isinstance(fin, RunFinished) else
                 {k: v for k, v in metrics.summarize(events).items()
                  if k in metrics.CONTRACT_KEYS})
            yield target.decode(metrics.token_ids(events)), m | {"batched": batched}

    @gpu
    def speculate(prompt: str, strategy: str = "ngram", max_new_tokens: int = 64,
                  temperature: float = 0.0, seed: int = 0) -> tuple[str, dict[str, Any]]:
        """Generate with one strategy and return the text and its metrics.

        Args:
            prompt: the user message (the chat template is applied).
            strategy: a strategy id, e.g. "ar" or "ngram" (see the Models & guide tab).
            max_new_tokens: 1..4096 new tokens.
            temperature: 0 for greedy; > 0 samples (lossless: the target's distribution).
            seed: the sampling seed.
        Returns:
            the generated text, and the metrics: new_tokens, wall_s, tokens_per_s,
            target_forwards, mean_accepted_length, acceptance_by_position, draft_s, verify_s
            (plus other_s, stop_reason, and `batched`: whether it shared the app's batch).
        """
        try:
            out = ("", {})
            for out in updates(prompt, strategy, max_new_tokens, temperature, seed, 3600):
                pass
        except session.UserError as exc:
            raise gr.Error(str(exc)) from None
        return out

    @gpu
    def speculate_stream(prompt: str, strategy: str = "ngram", max_new_tokens: int = 64,
                         temperature: float = 0.0,
                         seed: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
        """Like /speculate, but streams (text so far, live metrics) a few times per second.

        Args:
            prompt: the user message (the chat template is applied).
            strategy: a strategy id.
            max_new_tokens: 1..4096 new tokens.
            temperature: 0 for greedy.
            seed: the sampling seed.
        """
        try:
            yield from updates(prompt, strategy, max_new_tokens, temperature, seed, 0.25)
        except session.UserError as exc:
            raise gr.Error(str(exc)) from None

    return speculate, speculate_stream
