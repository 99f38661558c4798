"""The optional LLM judge (off by default): for a task whose grader is ``judge``, a model
is asked whether the submitted answer means the same as the reference. Deterministic
graders are preferred wherever an answer has one right form; a judge is for free-text
answers, and its verdict is only as good as the judge model."""

from __future__ import annotations

import json
import re

from ..errors import LLMError
from ..executor.llm import LLMClient

__all__ = ["JUDGE_PROMPT", "judge"]

JUDGE_PROMPT = """\
You grade an answer against a reference answer for the same question. Reply with one word:
CORRECT if the answer states the same facts as the reference (wording, order and formatting
may differ; numbers must agree to the precision the reference gives), else WRONG.

Question: {question}
Reference answer: {reference}
Answer to grade: {answer}"""

_VERDICT = re.compile(r"\b(CORRECT|WRONG)\b")


def judge(llm: LLMClient, question: str, answer: object, reference: object) -> tuple[bool, str]:
    """(correct, the judge's reply). A reply with neither verdict, or a failed call, counts
    as wrong, and the reply says why."""
    prompt = JUDGE_PROMPT.format(question=question,
                                 reference=json.dumps(reference, ensure_ascii=False),
                                 answer=json.dumps(answer, ensure_ascii=False, default=repr))
    try:
        c = llm.complete([{"role": "user", "content": prompt}], temperature=0.0)
    except LLMError as exc:
        return False, f"judge call failed: {type(exc).__name__}: {exc}"
    text = (c.content or "").strip()
    m = _VERDICT.search(text.upper())
    return (m is not None and m.group(1) == "CORRECT"), text[:500]
