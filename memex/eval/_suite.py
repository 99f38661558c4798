"""What a suite is: tasks (a question, a typed answer schema, a reference answer, a grader)
and a workspace builder that makes the data and the tools for one seed.

A suite is data plus code a user can write: ``Suite(name=..., build=fn)`` where
``fn(seed, workdir)`` returns a :class:`Workspace`. Tasks can come from a task file
(:func:`load_tasks`, YAML or JSON) or be generated with the data, so that each seed has its
own reference answers and memorising them is useless.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..host_tools import Tool
from ._grade import GRADERS

__all__ = ["EvalTask", "Suite", "Workspace", "load_suite", "load_tasks"]


@dataclass(frozen=True, kw_only=True)
class EvalTask:
    """One question. ``answer`` is the submit schema (a type, a pydantic model, or a JSON
    Schema mapping); ``reference`` the correct answer as JSON-like data; ``grader`` one of
    ``exact | numeric | set | dict`` with ``tolerance`` for numbers; ``tags`` free labels
    (difficulty, kind) the report can group by."""

    id: str
    question: str
    answer: Any
    reference: Any
    grader: str = "exact"
    tolerance: float = 1e-6
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.id or not isinstance(self.id, str):
            raise ConfigError("an eval task needs a non-empty string id")
        if not isinstance(self.question, str) or not self.question.strip():
            raise ConfigError(f"task {self.id!r}: the question must be a non-empty string")
        if self.grader not in GRADERS:
            raise ConfigError(f"task {self.id!r}: unknown grader {self.grader!r} "
                              f"(one of {', '.join(GRADERS)})")
        if not self.tolerance >= 0:
            raise ConfigError(f"task {self.id!r}: tolerance must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Workspace:
    """One seed's data, as the agent sees it: tools, inputs (typed guest variables), the
    modules to preload, instructions added to the prompt, and the tasks with this seed's
    reference answers."""

    tasks: tuple[EvalTask, ...]
    tools: tuple[Tool | Callable[..., Any], ...] = ()
    inputs: Mapping[str, Any] = field(default_factory=dict)
    preload: tuple[str, ...] = ("pandas",)
    instructions: str = ""

    def __post_init__(self) -> None:
        ids = [t.id for t in self.tasks]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ConfigError(f"a workspace's task ids must be unique, repeated: {dup}")
        for t in self.tasks:
            _check_reference(t)


def _check_reference(task: EvalTask) -> None:
    """Refuse a task whose reference the agent could not submit: its answer schema's own
    check (the submit tool's) must accept it, else every answer would be graded wrong."""
    from ..executor.internal import make_submit_tool
    from ..host_tools import ArgumentsInvalid

    try:
        make_submit_tool(task.answer, lambda _a: None).checker.arguments(
            {"answer": task.reference})
    except ArgumentsInvalid as exc:
        raise ConfigError(f"task {task.id!r}: its reference {task.reference!r:.120} does not "
                          f"fit its answer schema: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class Suite:
    """A named suite: ``build(seed, workdir)`` makes one seed's :class:`Workspace` (files it
    writes go under ``workdir``, a folder of their own)."""

    name: str
    build: Callable[[int, Path], Workspace]
    description: str = ""


def load_tasks(path: str | Path) -> tuple[EvalTask, ...]:
    """Tasks from a YAML or JSON file: a list of mappings with ``id``, ``question``,
    ``answer`` (a JSON Schema), ``reference`` and optionally ``grader``, ``tolerance``,
    ``tags``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the task file {p}: {exc}") from exc
    if isinstance(data, Mapping):
        data = data.get("tasks")
    if not isinstance(data, list):
        raise ConfigError(f"{p}: a task file holds a list of tasks (or {{tasks: [...]}})")
    out = []
    allowed = {"id", "question", "answer", "reference", "grader", "tolerance", "tags"}
    for i, item in enumerate(data):
        if not isinstance(item, Mapping):
            raise ConfigError(f"{p}: task {i} is not a mapping")
        unknown = sorted(set(item) - allowed)
        if unknown or "reference" not in item:
            what = f"unknown keys {unknown}" if unknown else "no reference"
            raise ConfigError(f"{p}: task {i} ({item.get('id', '?')}): {what}")
        schema = item.get("answer")
        if schema is not None and not isinstance(schema, Mapping):
            raise ConfigError(f"{p}: task {i}: answer must be a JSON Schema mapping")
        out.append(EvalTask(id=str(item.get("id", "")), question=item.get("question", ""),
                            answer=schema, reference=item["reference"],
                            grader=item.get("grader", "exact"),
                            tolerance=float(item.get("tolerance", 1e-6)),
                            tags=tuple(str(t) for t in item.get("tags", ()))))
    return tuple(out)


def load_suite(spec: str, bundled: Mapping[str, Suite]) -> Suite:
    """A bundled suite by name, or ``path/to/file.py`` (optionally ``:NAME``) defining a
    :class:`Suite` (``SUITE`` unless named)."""
    if spec in bundled:
        return bundled[spec]
    file, _, attr = spec.partition(":")
    path = Path(file)
    if path.suffix != ".py" or not path.is_file():
        raise ConfigError(f"no suite {spec!r}: bundled are {', '.join(sorted(bundled))}, "
                          "or give path/to/suite.py[:NAME]")
    name = f"memex_user_suite_{abs(hash(path.resolve()))}"
    loader = importlib.util.spec_from_file_location(name, path)
    if loader is None or loader.loader is None:
        raise ConfigError(f"cannot import the suite file {path}")
    module = importlib.util.module_from_spec(loader)
    sys.modules[name] = module
    try:
        loader.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(f"importing the suite file {path} failed: "
                          f"{type(exc).__name__}: {exc}") from exc
    suite = getattr(module, attr or "SUITE", None)
    if not isinstance(suite, Suite):
        raise ConfigError(f"{path} defines no Suite named {attr or 'SUITE'!r}")
    return suite
