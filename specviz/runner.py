"""Running one request end to end: prompt text -> events, with the strategy's drafter.

Boundary: glue shared by the CLI, the bench and the UI (strategy lookup, prompt encoding,
engine run, trace writing). It owns no model state beyond the registry's drafter cache.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Iterator

from specviz import events as ev
from specviz import strategies
from specviz.engine.decode import BadRequest, GenSettings, run
from specviz.models.target import Target


@dataclass
class Result:
    strategy: str
    token_ids: list[int]
    text: str
    events: list[ev.Event]

    @classmethod
    def of(cls, strategy: str, events: list[ev.Event]) -> "Result":
        """The result of a finished run's events (the last one is its RunFinished)."""
        tokens = [t for e in events if isinstance(e, ev.Accepted) for t in e.new_tokens]
        return cls(strategy, tokens, events[-1].text, events)

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


def stream(target: Target, strategy: str, prompt_ids: list[int], settings: GenSettings,
           overrides: dict[str, Any] | None = None,
           cancel: threading.Event | None = None) -> Iterator[ev.Event]:
    """Events of one run. Raises UnknownStrategy / ValueError / BadRequest / DrafterUnavailable
    before the first event for a request that cannot run."""
    strategy_settings = strategies.parse_settings(strategy, overrides)
    drafter = strategies.drafter_for(target, strategy, strategy_settings)
    settings.check()
    return run(target, prompt_ids, settings, drafter, strategy=strategy,
               strategy_settings=strategies.settings_dict(strategy_settings),
               drafter_id=strategy if drafter is not None else None, cancel=cancel)


def generate(target: Target, strategy: str, prompt_ids: list[int], settings: GenSettings,
             overrides: dict[str, Any] | None = None) -> Result:
    return Result.of(strategy, list(stream(target, strategy, prompt_ids, settings, overrides)))
