"""Hypothesis properties whose examples share one Spark evaluation instead of starting jobs each.

Hypothesis draws every example of the profile first, without Spark; one evaluation (one job, or
one fleet mark) judges them all; each outcome is checked against its oracle. When one fails, the
same examples are drawn again (the same test function, so the same derandomized sequence), those
the batch found right are passed over and the others evaluated one at a time, so that hypothesis
shrinks the failure and reports its smallest form.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import Column
from pyspark.sql import functions as F


def check_in_one_job(
    cases: st.SearchStrategy[Any],
    evaluate: Callable[[Sequence[Any]], Sequence[Any]],
    check: Callable[[Any, Any], None],
) -> None:
    """`evaluate(cases)` gives each case's outcome in one evaluation; `check(case, outcome)` asserts.
    A failure, of the evaluation or of a check, is looked for again one example at a time."""
    drawn: list[Any] = []
    passed: set[str] = set()  # the reprs of the cases the batch found right
    shrinking = False

    @given(cases)
    def example(case: Any) -> None:
        if not shrinking:
            drawn.append(case)
        elif repr(case) not in passed:
            check(case, evaluate([case])[0])

    example()
    try:
        for case, outcome in zip(drawn, evaluate(drawn), strict=True):
            check(case, outcome)
            passed.add(repr(case))
    except Exception:
        shrinking = True
        example()  # hypothesis finds the failure again, shrinks it and raises it
        raise  # it fails in the batch only


def per_case(conditions: Sequence[Column]) -> Column:
    """`conditions[k]` on the rows whose `case` column is k: every case's own expression in one."""
    expression = F.when(F.col("case") == 0, conditions[0])
    for case, condition in enumerate(conditions[1:], start=1):
        expression = expression.when(F.col("case") == case, condition)
    return expression
