"""The one path from a request to events: strategy + settings -> drafter -> engine run.

Boundary: glue shared by the CLI, the bench, the UI, the demo recorder and the batched server
(strategy lookup and settings, prompt encoding, the engine run). `prepare` checks a request and
builds its drafter; `events` runs a prepared request; `stream` / `generate` do both. It owns no
model state beyond the registry's drafter cache.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Iterator

from specviz import events as ev
from specviz import metrics, strategies
from specviz.engine.decode import BadRequest, GenSettings, run, run_started
from specviz.engine.drafter import Drafter
from specviz.models.target import Target


@dataclass
class RunSpec:
    """A checked request, ready to run: the strategy's settings and its (cached) drafter."""
    strategy: str
    prompt_ids: list[int]
    gen: GenSettings
    settings: Any = None            # the strategy's settings dataclass (None for `ar`)
    drafter: Drafter | None = None

    @property
    def settings_dict(self) -> dict[str, Any]:
        return strategies.settings_dict(self.settings)


@dataclass
class Result:
    strategy: str
    token_ids: list[int]
    text: str
    events: list[ev.Event]

    @classmethod
    def of(cls, strategy: str, events: list[ev.Event]) -> "Result":
        """The result of a finished run's events (the last one is its RunFinished)."""
        return cls(strategy, metrics.token_ids(events), events[-1].text, events)

    @property
    def finished(self) -> ev.RunFinished:
        fin = self.events[-1]
        assert isinstance(fin, ev.RunFinished)
        return fin


def encode(target: Target, prompt: str | list[dict], chat: bool | None = None) -> list[int]:
    if isinstance(prompt, str) and not prompt.strip():
        raise BadRequest("the prompt is empty")
    if isinstance(prompt, list) and not prompt:
        raise BadRequest("the prompt has no messages")
    use_chat = bool(target.tokenizer.chat_template) if chat is None else chat
    return target.encode(prompt, chat=use_chat)


def prepare(target: Target, *, strategy: str, prompt_ids: list[int], gen: GenSettings,
            overrides: dict[str, Any] | None = None) -> RunSpec:
    """Check a request and build its drafter. Raises UnknownStrategy / ValueError / BadRequest /
    DrafterUnavailable for a request that cannot run."""
    settings = strategies.parse_settings(strategy, overrides)
    drafter = strategies.drafter_for(target, strategy, settings)
    gen.check()
    return RunSpec(strategy, list(prompt_ids), gen, settings, drafter)


def started(target: Target, spec: RunSpec) -> ev.RunStarted:
    """The RunStarted event of a prepared request (the batched engine's requests need it)."""
    return run_started(target, spec.prompt_ids, spec.gen, spec.strategy, spec.settings_dict,
                       spec.strategy if spec.drafter is not None else None)


def events(target: Target, spec: RunSpec, cancel: threading.Event | None = None
           ) -> Iterator[ev.Event]:
    """The events of a prepared request's run."""
    return run(target, spec.prompt_ids, spec.gen, spec.drafter, strategy=spec.strategy,
               strategy_settings=spec.settings_dict,
               drafter_id=spec.strategy if spec.drafter is not None else None, cancel=cancel)


def stream(target: Target, *, strategy: str, prompt_ids: list[int], gen: GenSettings,
           overrides: dict[str, Any] | None = None,
           cancel: threading.Event | None = None) -> Iterator[ev.Event]:
    """Events of one run; a request that cannot run raises before the first event."""
    return events(target, prepare(target, strategy=strategy, prompt_ids=prompt_ids, gen=gen,
                                  overrides=overrides), cancel)


def generate(target: Target, *, strategy: str, prompt_ids: list[int], gen: GenSettings,
             overrides: dict[str, Any] | None = None) -> Result:
    return Result.of(strategy, list(stream(target, strategy=strategy, prompt_ids=prompt_ids,
                                           gen=gen, overrides=overrides)))
