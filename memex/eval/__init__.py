"""``memex eval``: code-as-action against tool calling on your own model and tasks.

A :class:`Suite` builds one seed's :class:`Workspace` (tools, inputs, tasks with reference
answers); :func:`run_eval` runs every task in each action space on one backend, grading and
appending each rollout to ``results.jsonl`` (``_runner``, ``_results``, ``_grade``);
:func:`summarise` / :func:`format_summaries` / :func:`pareto_plot` make the report
(``_report``); :func:`audit` classifies failures with a MemEx agent (``_audit``);
:func:`export_rollouts` turns rollouts into training data (``_export``). Bundled suites are
in ``suites``.
"""

from ._audit import FAILURE_KINDS, FailureClass, audit, load_audit
from ._export import export_rollouts
from ._grade import grade
from ._report import Summary, by_task, format_by_task, format_summaries, pareto_plot, summarise
from ._results import RolloutResult, load_results
from ._runner import run_eval
from ._suite import EvalTask, Suite, Workspace, load_suite, load_tasks
from .suites import SUITES

__all__ = [
    "FAILURE_KINDS",
    "SUITES",
    "EvalTask",
    "FailureClass",
    "RolloutResult",
    "Suite",
    "Summary",
    "Workspace",
    "audit",
    "by_task",
    "export_rollouts",
    "format_by_task",
    "format_summaries",
    "grade",
    "load_audit",
    "load_results",
    "load_suite",
    "load_tasks",
    "pareto_plot",
    "run_eval",
    "summarise",
]
