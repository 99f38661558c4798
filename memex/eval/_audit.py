"""``memex eval audit``: MemEx audits MemEx. For each failed rollout a MemEx agent gets the
question, the reference answer, the submitted answer and the whole trajectory as typed
objects in its sandbox (never pasted into its context) and classifies the failure on the
taxonomy below; the verdicts are typed records, appended to ``audit.jsonl``.

Taxonomy (``FAILURE_KINDS``):

* grounding errors: ``preliminary_vs_revised`` (a preliminary figure where the final one was
  asked, or the reverse), ``ambiguous_term`` (a term of the question read another way),
  ``wrong_column``, ``wrong_table`` (a look-alike or legacy table);
* strategy and execution errors: ``wrong_retrieval_plan`` (the plan could not reach the
  answer), ``transcription_error`` (a right value seen, a different one submitted),
  ``arithmetic_error``;
* loop outcomes: ``no_answer`` (no submit before the budget ran out), ``answer_shape``
  (submits rejected by the schema), ``other``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from ..errors import ConfigError
from ..executor import (
    Budget,
    Hooks,
    MemexAgent,
    SandboxSpec,
    Trajectory,
    load_trajectories,
)
from ..executor.llm import LLMClient
from ._results import TRAJECTORIES, JsonlFile, RolloutResult, load_results, read_jsonl

__all__ = ["AUDIT", "AUDIT_TRAJECTORIES", "FAILURE_KINDS", "AuditVerdict", "FailureClass",
           "audit", "load_audit"]

AUDIT = "audit.jsonl"
AUDIT_TRAJECTORIES = "audit-trajectories.jsonl"
"""The auditor's own rollouts, beside its verdicts: each verdict's ``audit_trajectory``
names its rollout there, so a verdict can be traced to what the auditor read and ran."""

FailureKind = Literal[
    "preliminary_vs_revised", "ambiguous_term", "wrong_column", "wrong_table",
    "wrong_retrieval_plan", "transcription_error", "arithmetic_error",
    "no_answer", "answer_shape", "other"]
FAILURE_KINDS: tuple[str, ...] = FailureKind.__args__  # type: ignore[attr-defined]


class FailureClass(BaseModel):
    """What the audit agent submits for one failed rollout."""

    kind: FailureKind = Field(description="the failure's class on the taxonomy")
    evidence: str = Field(description="one sentence: the step and what in it shows the kind")


@dataclass(frozen=True, kw_only=True)
class AuditVerdict:
    """One audited failure; ``kind`` is None when the audit agent gave no valid verdict
    (``end_reason`` says why)."""

    trajectory: str
    suite: str
    task: str
    space: str
    seed: int
    kind: str | None
    evidence: str
    end_reason: str
    auditor: str
    audit_trajectory: str = ""  # the auditor's rollout in audit-trajectories.jsonl


TASK = (
    "Another agent failed a task. In your session: `question` (str), `reference` (the correct "
    "answer), `submitted` (what it submitted, None if nothing) and `trajectory` (a Trajectory "
    "record: .steps, each with .code, .observation, .status, .error). Find where it went "
    "wrong: print the steps' code and the start of their observations, compare with the "
    "reference, then submit the failure's kind and one sentence of evidence. Kinds: "
    "preliminary_vs_revised (used a preliminary figure where the final one was asked), "
    "ambiguous_term (read a term of the question another way), wrong_column, wrong_table "
    "(a look-alike or legacy table), wrong_retrieval_plan, transcription_error (saw the right "
    "value, submitted another), arithmetic_error, no_answer (never submitted), answer_shape "
    "(its submits were rejected), other.")


def audit(out: str | Path, *, llm: LLMClient, limit: int | None = None, max_turns: int = 6,
          backend: str | None = None,
          progress: Callable[[AuditVerdict, int, int], None] | None = None
          ) -> list[AuditVerdict]:
    """Audit the failed rollouts of the run folder ``out`` not audited yet (at most
    ``limit``), appending each verdict to ``out/audit.jsonl``; returns the new verdicts."""
    folder = Path(out)
    results = [r for r in load_results(folder) if not (r.correct or r.endpoint_failed)]
    seen = {v.trajectory for v in load_audit(folder)} if (folder / AUDIT).exists() else set()
    todo = [r for r in results if r.trajectory not in seen][:limit]
    if not todo:
        return []
    trajectories = {t.id: t for t in load_trajectories(folder / TRAJECTORIES)}
    verdicts = []
    with MemexAgent(model=llm, submit=FailureClass, budget=Budget(max_turns=max_turns),
                    sandbox=SandboxSpec(backend=backend, preload=("pandas",)),
                    hooks=Hooks(trajectory_path=folder / AUDIT_TRAJECTORIES)) as agent, \
            contextlib.closing(JsonlFile(folder / AUDIT)) as f:
        for i, r in enumerate(todo, 1):
            t = trajectories.get(r.trajectory)
            if t is None:
                raise ConfigError(f"{folder / TRAJECTORIES} has no trajectory {r.trajectory}")
            v = _audit_one(agent, r, t, str(llm.model))
            f.append(asdict(v))
            verdicts.append(v)
            if progress is not None:
                progress(v, i, len(todo))
    return verdicts


def _audit_one(agent: MemexAgent, r: RolloutResult, t: Trajectory, auditor: str
               ) -> AuditVerdict:
    rollout = agent.run(TASK, inputs={"question": t.task, "reference": r.reference,
                                      "submitted": r.answer, "trajectory": t})
    answer = rollout.answer if isinstance(rollout.answer, FailureClass) else None
    return AuditVerdict(
        trajectory=r.trajectory, suite=r.suite, task=r.task, space=r.space, seed=r.seed,
        kind=answer.kind if answer else None, evidence=answer.evidence if answer else "",
        end_reason=rollout.end_reason, auditor=auditor,
        audit_trajectory=rollout.trajectory.id)


def load_audit(out: str | Path) -> list[AuditVerdict]:
    """The verdicts in ``out/audit.jsonl`` (or that file)."""
    p = Path(out)
    return read_jsonl(p / AUDIT if p.is_dir() else p, lambda d: AuditVerdict(**d),
                      "audit verdict")
