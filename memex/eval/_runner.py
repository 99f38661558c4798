"""``run_eval``: every (seed, task, action space) of a suite as a rollout of the same agent
(one prompt core, the same tools and aids: only the action space differs), ``concurrency``
at a time on one backend, graded and appended as each finishes. Rollouts already in the
results file are skipped, so a stopped run resumes where it stopped and none runs twice;
a rollout whose model endpoint failed is not counted as done, and a run whose endpoint fails
``ENDPOINT_FAILURES`` rollouts in a row stops rather than record the rest as failures."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from ..backends import Backend, get_backend
from ..errors import ConfigError, LLMError
from ..executor import Aids, Budget, MemexAgent, Rollout, SandboxSpec
from ..executor.internal import TrajectoryWriter
from ..executor.llm import LLMClient
from ..runtime_wasm import AGENT_LIMITS, Limits
from ._grade import grade
from ._judge import judge as judge_answer
from ._results import RESULTS, TRAJECTORIES, JsonlFile, RolloutResult, load_results
from ._suite import EvalTask, Suite, Workspace

__all__ = ["ENDPOINT_FAILURES", "EvalRun", "Job", "run_eval"]

SPACES = ("code", "tools")
ORDERS = ("interleaved", "by_space")
# what a rollout's tool calls do not count: the answer, and code run as a call
_NOT_TOOLS = ("submit", "python_exec")
ENDPOINT_FAILURES = 3
"""Rollouts in a row whose model endpoint failed (with none finishing in between) after
which a run stops: an endpoint that is down would otherwise fail every rollout left."""


@dataclass(frozen=True, kw_only=True)
class Job:
    """One rollout to run."""

    seed: int
    task: EvalTask
    space: str


@dataclass(frozen=True, kw_only=True)
class EvalRun:
    """What a call of :func:`run_eval` did: ``results`` holds every result of the run
    folder for this suite, model and variant (earlier runs' included); ``ran`` how many
    rollouts this call ran, ``skipped`` how many were already there."""

    out: Path
    results: tuple[RolloutResult, ...]
    ran: int
    skipped: int


def run_eval(
    suite: Suite, *, llm: LLMClient, out: str | Path, spaces: Sequence[str] = SPACES,
    seeds: Iterable[int] = (0,), concurrency: int = 1, tasks: Sequence[str] | None = None,
    limit: int | None = None, variant: str = "default", aids: Aids | None = None,
    budget: Budget | None = None, limits: Limits | None = None,
    backend: str | Backend = "pool", progress: Callable[[RolloutResult, int, int], None]
    | None = None, judge: LLMClient | None = None, order: str = "interleaved",
) -> EvalRun:
    """Run ``suite`` on ``llm`` in each action space of ``spaces`` for each seed; results
    go to ``out/results.jsonl`` and trajectories to ``out/trajectories.jsonl``.

    ``tasks`` keeps only the named task ids and ``limit`` the first N tasks of each seed;
    ``variant`` names the ``aids`` setting in the results (compare variants with
    ``memex eval report``). ``backend`` is a backend name (made here, ``concurrency``
    workers, closed at the end) or a Backend of the caller's. ``progress(result, done,
    total)`` is called after each rollout. ``judge`` is the model that grades tasks whose
    grader is ``judge`` (none: such tasks are refused before anything runs). ``order``:
    ``interleaved`` (the default: seed by seed, task by task, each task in every action
    space in turn, so a run stopped early still compares the spaces on the same tasks) or
    ``by_space`` (every rollout of the first space, then the next: one model cache warm for
    one prompt style at a time).

    A rollout whose endpoint failed (``RolloutResult.endpoint_failed``) is written but not
    counted: the next run of the same folder runs it again. After ``ENDPOINT_FAILURES`` of
    them in a row the run stops with :class:`~memex.errors.LLMError`; what finished is on
    disk."""
    if order not in ORDERS:
        raise ConfigError(f"order is one of {', '.join(ORDERS)}, got {order!r}")
    bad = [s for s in spaces if s not in SPACES]
    if bad or not spaces:
        raise ConfigError(f"action spaces are {SPACES}, got {list(spaces)}")
    if concurrency < 1:
        raise ConfigError("concurrency must be >= 1")
    if not variant or not variant.replace("-", "").replace("_", "").replace("=", "").isalnum():
        raise ConfigError(f"a variant name is letters, digits, '-', '_' or '=', got {variant!r}")
    seeds = list(dict.fromkeys(seeds))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(llm.model)
    done = {r.key for r in _earlier(out) if not r.endpoint_failed}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="memex-eval-")))
        plan: list[tuple[Job, Workspace]] = []
        skipped = 0
        for seed in seeds:
            ws = _build(suite, seed, work / f"seed-{seed}")
            chosen = [t for t in ws.tasks if tasks is None or t.id in tasks][:limit]
            if tasks is not None and not chosen:
                raise ConfigError(f"none of the tasks {list(tasks)} is in suite {suite.name!r}")
            judged = [t.id for t in chosen if t.grader == "judge"]
            if judged and judge is None:
                raise ConfigError(f"tasks {judged} are graded by an LLM judge: give "
                                  "run_eval(judge=...) (memex eval run --judge-model)")
            for task in chosen:
                for space in spaces:
                    if (suite.name, model, variant, space, seed, task.id) in done:
                        skipped += 1
                    else:
                        plan.append((Job(seed=seed, task=task, space=space), ws))
        if order == "by_space":  # stable: within a space, the interleaved order
            plan.sort(key=lambda jw: list(spaces).index(jw[0].space))
        be: Backend | None = None
        if plan:
            if isinstance(backend, str):
                sized = backend in ("pool", "subprocess")
                be = get_backend(backend, **({"workers": concurrency} if sized else {}))
                stack.callback(be.close)
            else:
                be = backend
        results = stack.enter_context(contextlib.closing(JsonlFile(out / RESULTS)))
        trajectories = stack.enter_context(TrajectoryWriter(out / TRAJECTORIES))
        runner = _Runner(suite=suite, llm=llm, model=model, variant=variant,
                         aids=aids or Aids(), budget=budget or Budget(max_turns=8),
                         limits=limits or AGENT_LIMITS, backend=be, judge=judge)
        ran = _run_all(plan, runner, concurrency, results, trajectories, progress, out)
    every = tuple(r for r in _earlier(out)
                  if r.suite == suite.name and r.model == model and r.variant == variant)
    return EvalRun(out=out, results=every, ran=ran, skipped=skipped)


def _earlier(out: Path) -> list[RolloutResult]:
    return load_results(out / RESULTS) if (out / RESULTS).exists() else []


def _build(suite: Suite, seed: int, workdir: Path) -> Workspace:
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        ws = suite.build(seed, workdir)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"suite {suite.name!r} could not build seed {seed}: "
                          f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(ws, Workspace):
        raise ConfigError(f"suite {suite.name!r}: build() returned {type(ws).__name__}, "
                          "not a Workspace")
    return ws


@dataclass(frozen=True, kw_only=True)
class _Runner:
    suite: Suite
    llm: LLMClient
    model: str
    variant: str
    aids: Aids
    budget: Budget
    limits: Limits
    backend: Backend | None
    judge: LLMClient | None

    def __call__(self, job: Job, ws: Workspace) -> tuple[RolloutResult, Rollout]:
        agent = MemexAgent(
            model=self.llm, tools=ws.tools, submit=job.task.answer,
            instructions=ws.instructions, action_space=job.space,  # type: ignore[arg-type]
            sandbox=SandboxSpec(limits=self.limits, preload=ws.preload, backend=self.backend),
            budget=self.budget, aids=self.aids)
        rollout = agent.run(job.task.question, inputs=ws.inputs)
        t = rollout.trajectory
        note = None
        if not t.submitted:
            ok = False
        elif job.task.grader == "judge" and self.judge is not None:
            ok, note = judge_answer(self.judge, job.task.question, t.answer,
                                    job.task.reference)
        else:
            ok = grade(t.answer, job.task.reference, job.task.grader,
                       tolerance=job.task.tolerance)
        result = RolloutResult(
            suite=self.suite.name, model=self.model, variant=self.variant, space=job.space,
            seed=job.seed, task=job.task.id, correct=ok, answer=t.answer,
            reference=job.task.reference, end_reason=t.end_reason, turns=len(t.steps),
            llm_calls=t.llm_calls, tool_calls=sum(1 for c in t.tool_calls
                                                  if c.name not in _NOT_TOOLS),
            prompt_tokens=t.prompt_tokens, completion_tokens=t.completion_tokens,
            seconds=round(t.duration, 3), cost=t.cost, trajectory=t.id,
            tags=job.task.tags, error=t.error, judged=note)
        return result, rollout


def _run_all(plan: list[tuple[Job, Workspace]], runner: _Runner, concurrency: int,
             results: JsonlFile, trajectories: TrajectoryWriter,
             progress: Callable[[RolloutResult, int, int], None] | None, out: Path) -> int:
    """Run the plan ``concurrency`` at a time; each result is written as it comes. An
    interrupt (Ctrl-C), or an endpoint that failed ``ENDPOINT_FAILURES`` rollouts in a row
    (LLMError), stops starting new rollouts, waits for none, and raises: what finished is on
    disk."""
    if not plan:
        return 0
    done = 0
    failing = 0  # endpoint failures since the last rollout that ran to an outcome
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="memex-eval")
    pending: set[Future[tuple[RolloutResult, Rollout]]] = set()
    queue = list(reversed(plan))
    try:
        while queue or pending:
            while queue and len(pending) < concurrency:
                job, ws = queue.pop()
                pending.add(pool.submit(runner, job, ws))
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                result, rollout = fut.result()
                trajectories.write(rollout.trajectory)
                results.append(result.to_dict())
                done += 1
                if progress is not None:
                    progress(result, done, len(plan))
                failing = failing + 1 if result.endpoint_failed else 0
                if failing >= ENDPOINT_FAILURES:
                    raise LLMError(
                        f"the model endpoint failed {failing} rollouts in a row, so the run "
                        f"stopped (last: {result.error}). Those rollouts are not counted: "
                        f"fix the endpoint and run the same command again to run them and "
                        f"the rest; finished rollouts are in {out}")
    finally:
        for fut in pending:
            fut.cancel()
        pool.shutdown(wait=not queue and not pending, cancel_futures=True)
    return done
