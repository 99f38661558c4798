"""The results of an eval run: one :class:`RolloutResult` per rollout, appended to
``results.jsonl`` as each finishes (so a stopped run resumes where it stopped), with the
whole trajectory in ``trajectories.jsonl`` under the same id."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO, Any

from ..errors import ConfigError

__all__ = ["RESULTS", "TRAJECTORIES", "ResultsFile", "RolloutResult", "load_results"]

RESULTS = "results.jsonl"
TRAJECTORIES = "trajectories.jsonl"


@dataclass(frozen=True, kw_only=True)
class RolloutResult:
    """One graded rollout. ``key`` (suite, model, variant, action space, seed, task) names
    it across runs; ``trajectory`` is the id of its trajectory in ``trajectories.jsonl``."""

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


def load_results(path: str | Path) -> list[RolloutResult]:
    """Every result in a results file (or a run folder holding ``results.jsonl``). A line
    cut short by a run that died mid-write is skipped; any other bad line is an error."""
    p = Path(path)
    if p.is_dir():
        p = p / RESULTS
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read eval results {p}: {exc}") from exc
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(RolloutResult.from_dict(json.loads(line)))
        except (ValueError, TypeError) as exc:
            if n == len(lines) and not line.endswith("}"):
                continue  # the last line of a run killed while writing it
            raise ConfigError(f"{p}:{n}: not an eval result ({exc})") from exc
    return out


class ResultsFile:
    """Appends results, one flushed line each; thread-safe. Idempotent ``close()``."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        _drop_cut_line(path)
        self._f: IO[str] | None = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()

    def append(self, r: RolloutResult) -> None:
        line = json.dumps(r.to_dict(), ensure_ascii=False, default=repr)
        with self._lock:
            if self._f is None:
                raise ConfigError(f"the results file {self.path} is closed")
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
