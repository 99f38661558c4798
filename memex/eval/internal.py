"""What ``memex eval``'s command line and its tests use of the harness and a user of the
library does not: the export and grader registries, the audit's and run's records and the
statistics helpers. Not a public surface: names here may change in any release. Pinned in
tests/test_public_api.py (``INTERNAL``) so that a change is still deliberate."""

from ._audit import AuditVerdict
from ._export import EXPORT_FORMATS
from ._grade import GRADERS, normalise_text
from ._report import FORMATS, TaskCell, wilson
from ._runner import EvalRun

__all__ = [
    "EXPORT_FORMATS",
    "FORMATS",
    "GRADERS",
    "AuditVerdict",
    "EvalRun",
    "TaskCell",
    "normalise_text",
    "wilson",
]
