"""The results of an eval run: one :class:`RolloutResult` per rollout, appended to
``results.jsonl`` as each finishes (so a stopped run resumes where it stopped), with the
whole trajectory in ``trajectories.jsonl`` under the same id."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO, Any, TypeVar

from ..errors import ConfigError

__all__ = ["RESULTS", "TRAJECTORIES", "JsonlFile", "RolloutResult", "latest", "load_results",
           "read_jsonl"]

T = TypeVar("T")

RESULTS = "results.jsonl"
TRAJECTORIES = "trajectories.jsonl"


@dataclass(frozen=True, kw_only=True)
class RolloutResult:
    """One graded rollout. ``key`` (suite, model, variant, action space, seed, task) names
    it across runs; ``trajectory`` is the id of its trajectory in ``trajectories.jsonl``;
    ``tool_calls`` counts calls of the suite's tools (not ``submit``, not ``python_exec``)."""

    suite: str
    model: str
    variant: str
    space: str
    seed: int
    task: str
    correct: bool
    answer: Any
    reference: Any
    end_reason: str
    turns: int
    llm_calls: int
    tool_calls: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    cost: float | None
    trajectory: str
    tags: tuple[str, ...] = ()
    error: str | None = None
    judged: str | None = None  # the judge model's reply, for tasks graded by one

    @property
    def key(self) -> tuple[str, str, str, str, int, str]:
        return (self.suite, self.model, self.variant, self.space, self.seed, self.task)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def endpoint_failed(self) -> bool:
        """The model endpoint failed (``llm_error``: unreachable, timing out, answering
        errors after the client's retries): the rollout says nothing about the model, so it
        is not counted and a later run of the same command runs it again."""
        return self.end_reason == "llm_error"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tags"] = list(self.tags)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RolloutResult:
        names = {f.name for f in fields(cls)}
        missing = sorted(n for n in names - set(d) if n not in ("tags", "error", "judged"))
        if missing:
            raise ValueError(f"missing fields {missing}")
        kw = {k: v for k, v in d.items() if k in names}
        kw["tags"] = tuple(kw.get("tags", ()))
        return cls(**kw)


def load_results(path: str | Path, *, every: bool = False) -> list[RolloutResult]:
    """The results in a results file (or a run folder holding ``results.jsonl``): one per
    rollout, its latest line (a rollout whose endpoint failed is run again by the next run,
    which appends a second line), or with ``every`` each line as written. A line cut short
    by a run that died mid-write is skipped; any other bad line is an error."""
    p = Path(path)
    found = read_jsonl(p / RESULTS if p.is_dir() else p, RolloutResult.from_dict,
                       "eval result")
    return found if every else latest(found)


def latest(results: Iterable[RolloutResult]) -> list[RolloutResult]:
    """The last result of each rollout (by ``key``), in the order rollouts first appear."""
    by_key: dict[tuple[str, str, str, str, int, str], RolloutResult] = {}
    for r in results:
        by_key[r.key] = r
    return list(by_key.values())


def read_jsonl(p: Path, parse: Callable[[dict[str, Any]], T], what: str) -> list[T]:
    """Each line of ``p`` parsed; the last line skipped when a process killed while writing
    it left it cut short; any other bad line is a ConfigError naming it."""
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read {what}s from {p}: {exc}") from exc
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            out.append(parse(data))
        except (ValueError, TypeError) as exc:
            if n == len(lines) and not line.endswith("}"):
                continue  # the last line of a run killed while writing it
            raise ConfigError(f"{p}:{n}: not a valid {what} ({exc})") from exc
    return out


class JsonlFile:
    """Appends JSON lines, each flushed; thread-safe. A line left cut short by a process
    killed while writing it is cut off first. Idempotent ``close()``."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        _drop_cut_line(path)
        self._f: IO[str] | None = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()

    def append(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, default=repr)
        with self._lock:
            if self._f is None:
                raise ConfigError(f"{self.path} is closed")
            self._f.write(line + "\n")
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


def _drop_cut_line(path: Path) -> None:
    """Cut off a last line left without its newline by a run killed while writing it, so
    the next result starts a line of its own."""
    try:
        with open(path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
    except FileNotFoundError:
        pass
