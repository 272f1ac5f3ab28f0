"""Typed decoding events and their JSON / JSONL trace form.

Boundary: plain dataclasses and (de)serialisation only. No torch, no UI. Every decoding step
(draft -> verify -> accept -> update) emits enough events for a viewer to redraw that step with
no other input; a trace file is one event per line and round-trips exactly.
"""
from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

SCHEMA_VERSION = 1


class TraceError(ValueError):
    """A trace (file or event dict) is malformed, truncated or of another schema version."""


@dataclass(frozen=True)
class RunStarted:
    strategy: str
    settings: dict[str, Any]
    target_id: str
    drafter_id: str | None
    device: str
    dtype: str
    prompt_ids: list[int]
    prompt_pieces: list[str]
    seed: int
    t: float = 0.0
    schema: int = SCHEMA_VERSION


@dataclass(frozen=True)
class DraftProposed:
    """The step's draft tree. Node 0 is the root (last committed token, not verified again).

    Lists are per node, root included: token, piece, parent (-1 for the root), depth, q of the
    token under the draft (None where the draft is deterministic: q one-hot), confidence
    (None where the strategy has none).
    """
    step: int
    tokens: list[int]
    pieces: list[str]
    parents: list[int]
    depths: list[int]
    q: list[float | None]
    confidence: list[float | None]
    draft_s: float
    fallback: bool = False
    note: str = ""
    t: float = 0.0


@dataclass(frozen=True)
class ScheduleDecided:
    """How many drafted tokens go to the target this step, and why (threshold, budget, argmax)."""
    step: int
    confidence: list[float]
    survival: list[float]
    verify_len: int
    reason: str
    threshold: float | None = None
    sps_point: list[float] | None = None
    t: float = 0.0


@dataclass(frozen=True)
class Verified:
    """Per node (root included): p of the drafted token, target argmax and the acceptance draw.

    p[i] and argmax[i] describe the target at node i's *own* token given its parent, so the
    root's entries are None. draw[i] is the uniform draw used to accept node i under sampling.
    """
    step: int
    p: list[float | None]
    argmax: list[int | None]
    argmax_pieces: list[str | None]
    draw: list[float | None]
    verify_s: float
    input_tokens: int
    t: float = 0.0


@dataclass(frozen=True)
class Accepted:
    """The accepted path (node ids, root first), and the one token the target adds itself."""
    step: int
    path: list[int]
    n_accepted: int
    token: int
    piece: str
    source: str  # "bonus" | "residual" | "argmax" | "sample"
    new_tokens: list[int]
    t: float = 0.0


@dataclass(frozen=True)
class KVUpdated:
    """Target (and drafter) cache lengths before/after; kept = compacted tree positions, dropped =
    rolled-back positions (absolute cache indices)."""
    step: int
    target_before: int
    target_after: int
    kept: list[int]
    dropped: list[int]
    drafter_before: int | None = None
    drafter_after: int | None = None
    t: float = 0.0


@dataclass(frozen=True)
class RunFinished:
    """Totals, computed from the step events by `metrics.finish` (replay recomputes them)."""
    new_tokens: int
    target_forwards: int
    wall_s: float
    draft_s: float
    verify_s: float
    other_s: float
    mean_accepted_length: float
    acceptance_by_position: list[float]
    tokens_per_s: float
    stop_reason: str
    text: str
    t: float = 0.0


# --- batched serving (engine/batch.py): one trace per serving run, ServeStarted .. ServeFinished


@dataclass(frozen=True)
class ServeStarted:
    """A batched serving run: strategy, verify-length policy, settings, the SPS curve
    ([batch tokens, verify steps/s] points) and whether the drafter's confidences are calibrated
    ("calibrated" | "uncalibrated" | "none")."""
    strategy: str
    policy: str
    settings: dict[str, Any]
    target_id: str
    drafter_id: str | None
    device: str
    dtype: str
    confidence: str
    sps_curve: list[list[float]]
    seed: int
    t: float = 0.0
    schema: int = SCHEMA_VERSION


@dataclass(frozen=True)
class RequestJoined:
    """A request joins the batch before batch step `step` + 1 (it was prefilled alone)."""
    step: int
    request: int
    prompt_ids: list[int]
    max_new_tokens: int
    seed: int
    t: float = 0.0


@dataclass(frozen=True)
class BatchScheduled:
    """The scheduler's decision for one batched step. Per request (in `requests` order): the
    prefix-survival curve a_j of its drafted chain, the chosen verify length and why. The
    expected tokens (sum of 1 + a_1 + .. + a_l), the batch tokens (sum of 1 + l) and the SPS
    point used ([batch tokens, steps/s]); budget: dspark-prod's K."""
    step: int
    requests: list[int]
    survival: list[list[float]]
    verify_lens: list[int]
    reasons: list[str]
    expected_tokens: float
    batch_tokens: int
    sps_point: list[float]
    draft_s: float
    budget: int | None = None
    t: float = 0.0


@dataclass(frozen=True)
class BatchVerified:
    """One batched target forward over every request's root and chosen drafts (packed, no
    padding): its input tokens, the shared cache length before and after the step (after
    rollback and any compaction) and its wall time."""
    step: int
    input_tokens: int
    cache_before: int
    cache_after: int
    verify_s: float
    t: float = 0.0


@dataclass(frozen=True)
class RequestStepped:
    """One request's part of a batched step: its drafted chain, how much of it was verified and
    accepted, and the tokens it committed (source: bonus | argmax | residual | sample)."""
    step: int
    request: int
    drafted: list[int]
    verify_len: int
    n_accepted: int
    new_tokens: list[int]
    source: str
    t: float = 0.0


@dataclass(frozen=True)
class RequestFinished:
    """A request leaves the batch after step `step`: its tokens, why it stopped, its text and
    when it joined (`joined_t`, seconds after ServeStarted)."""
    step: int
    request: int
    token_ids: list[int]
    stop_reason: str
    text: str
    joined_t: float
    t: float = 0.0


@dataclass(frozen=True)
class ServeFinished:
    """Totals of a serving run, computed from its events by `serving_metrics.finish`."""
    requests: int
    steps: int
    new_tokens: int
    wall_s: float
    throughput_tokens_per_s: float
    mean_per_request_tokens_per_s: float
    mean_accepted_length: float
    mean_batch_tokens: float
    t: float = 0.0


EVENT_TYPES = {cls.__name__: cls for cls in       # a single run's events
               (RunStarted, DraftProposed, ScheduleDecided, Verified, Accepted, KVUpdated, RunFinished)}
SERVE_TYPES = (ServeStarted, RequestJoined, BatchScheduled, BatchVerified, RequestStepped,
               RequestFinished, ServeFinished)      # a serving run's events
SERVE_EVENT_TYPES = {cls.__name__: cls for cls in SERVE_TYPES}
Event = (RunStarted | DraftProposed | ScheduleDecided | Verified | Accepted | KVUpdated | RunFinished
         | ServeStarted | RequestJoined | BatchScheduled | BatchVerified | RequestStepped
         | RequestFinished | ServeFinished)


def to_dict(event: Event) -> dict[str, Any]:
    d = dataclasses.asdict(event)
    d["type"] = type(event).__name__
    return d


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise TraceError(f"{where}: non-finite number {value!r}")
    if isinstance(value, (list, dict)):  # settings is a dict, possibly nested
        for v in (value.values() if isinstance(value, dict) else value):
            _check_finite(v, where)


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a field annotation (int, float, str, bool, None, Any, list[X],
    dict[str, Any] and unions of these: all the events use). JSON ints are valid floats."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (types.UnionType, typing.Union):
        return any(_conforms(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_conforms(k, args[0]) and _conforms(v, args[1])
                                               for k, v in value.items())
    if hint is type(None):
        return value is None
    if isinstance(value, bool):  # bool is an int subclass; only a bool field takes it
        return hint is bool
    if hint is float:
        return isinstance(value, (int, float))
    return isinstance(value, hint)


def from_dict(d: Any, where: str = "event") -> Event:
    if not isinstance(d, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(d).__name__}")
    kind = d.get("type")
    cls = EVENT_TYPES.get(kind) or SERVE_EVENT_TYPES.get(kind)
    if cls is None:
        raise TraceError(f"{where}: unknown event type {kind!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    body = {k: v for k, v in d.items() if k != "type"}
    unknown = set(body) - names
    missing = required - set(body)
    if unknown:
        raise TraceError(f"{where}: {kind} has unknown fields {sorted(unknown)}")
    if missing:
        raise TraceError(f"{where}: {kind} lacks fields {sorted(missing)}")
    hints = typing.get_type_hints(cls)
    for k, v in body.items():
        _check_finite(v, f"{where}: {kind}.{k}")
        if not _conforms(v, hints[k]):
            raise TraceError(f"{where}: {kind}.{k} should be {_type_name(hints[k])}, got {v!r:.60}")
    if cls in (RunStarted, ServeStarted) and body.get("schema", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise TraceError(f"{where}: trace schema version {body.get('schema')!r} is not supported "
                         f"(this specviz reads version {SCHEMA_VERSION})")
    try:
        return cls(**body)
    except TypeError as exc:  # pragma: no cover - guarded by the field checks above
        raise TraceError(f"{where}: {exc}") from None


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) if typing.get_origin(hint) is None else \
        str(hint).replace("typing.", "")


def dumps(event: Event) -> str:
    return json.dumps(to_dict(event), ensure_ascii=False, allow_nan=False)


def write_trace(events: Iterable[Event], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for ev in events:
            fh.write(dumps(ev) + "\n")


def parse_lines(lines: Iterable[str]) -> Iterator[Event]:
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"line {n}: not valid JSON ({exc.msg})") from None
        yield from_dict(d, where=f"line {n}")


def read_trace(path: str | Path) -> list[Event]:
    """Read and validate a JSONL trace: one RunStarted first, one RunFinished last."""
    try:
        with open(path, encoding="utf-8") as fh:
            events = list(parse_lines(fh))
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TraceError(f"trace {path} is not UTF-8 text") from None
    validate(events)
    return events


def validate(events: list[Event]) -> None:
    if not events:
        raise TraceError("trace is empty")
    start, end = (ServeStarted, ServeFinished) if isinstance(events[0], ServeStarted) else \
        (RunStarted, RunFinished)
    if not isinstance(events[0], start):
        raise TraceError("trace must start with RunStarted or ServeStarted")
    if not isinstance(events[-1], end):
        raise TraceError(f"trace is truncated: it does not end with {end.__name__}")
    if sum(isinstance(e, (RunStarted, RunFinished, ServeStarted, ServeFinished))
           for e in events) != 2:
        raise TraceError("trace must hold exactly one run")
    if start is ServeStarted and any(not isinstance(e, SERVE_TYPES) for e in events):
        raise TraceError("a serving trace holds serving events only")
    last_step = 0
    for e in events[1:-1]:
        step = getattr(e, "step", None)
        if step is None or step < last_step:
            raise TraceError(f"step numbers go backwards at {type(e).__name__} step {step}")
        last_step = step
