"""sbatch's --array text, property-style: any list of ranges reads as the indices it names, the normal form
reads back the same, and any other text is refused with a message (never another exception, never more
than the maximum of tasks). Pure: no database."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.arrayspec import ArraySpecError, parse_array

MAX = 1000
FAST = settings(max_examples=300, deadline=None)

pieces = st.one_of(
    st.integers(0, MAX - 1).map(lambda n: (str(n), {n})),
    st.tuples(st.integers(0, MAX - 1), st.integers(0, 60), st.integers(1, 9)).map(
        lambda t: (
            f"{t[0]}-{min(t[0] + t[1], MAX - 1)}" + (f":{t[2]}" if t[2] != 1 else ""),
            set(range(t[0], min(t[0] + t[1], MAX - 1) + 1, t[2])),
        )
    ),
)


@FAST
@given(st.lists(pieces, min_size=1, max_size=6), st.one_of(st.none(), st.integers(1, 5000)), st.booleans())
def test_any_list_of_ranges_reads_as_the_indices_it_names(chosen, limit, brackets):
    body = ",".join(text for text, _ in chosen)
    text = (f"[{body}]" if brackets else body) + (f"%{limit}" if limit is not None else "")
    spec = parse_array(text, max_size=MAX)
    wanted = sorted(set().union(*(indices for _, indices in chosen)))
    assert list(spec.indices) == wanted
    assert spec.count == len(wanted) <= MAX
    assert spec.max_running == limit
    again = parse_array(spec.text, max_size=MAX)  # the normal form reads back the same
    assert (again.indices, again.max_running, again.text) == (spec.indices, spec.max_running, spec.text)
    env = spec.env(array_id=77, index=wanted[0])
    assert (env["YARD_ARRAY_TASK_MIN"], env["YARD_ARRAY_TASK_MAX"]) == (str(wanted[0]), str(wanted[-1]))
    gaps = {b - a for a, b in pairwise(wanted)}
    assert env["YARD_ARRAY_TASK_STEP"] == str(gaps.pop() if len(gaps) == 1 else 1)


@FAST
@given(st.one_of(st.text(alphabet="0123456789-,:%[] x", max_size=30), st.text(max_size=12)))
def test_any_other_text_is_an_array_or_a_refusal_that_says_what_to_change(text):
    try:
        spec = parse_array(text, max_size=MAX)
    except ArraySpecError as exc:
        assert str(exc)
        return
    assert 1 <= spec.count <= MAX and all(0 <= i < MAX for i in spec.indices)


@FAST
@given(st.integers(MAX, 10**30), st.integers(0, MAX - 1))
def test_an_index_at_or_past_the_maximum_is_refused_without_expanding_the_range(end, start):
    with pytest.raises(ArraySpecError, match=f"from 0 to {MAX - 1}"):
        parse_array(f"{start}-{end}", max_size=MAX)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0-", "is not an index or a range"),
        ("-5", "is not an index or a range"),
        ("5-1", "give 1-5"),
        ("%0", "%0 would run no task"),
        ("0-9%0", "%0 would run no task"),
        ("0-9%", "after % give how many"),
        ("0-9%-1", "after % give how many"),
        ("0-9:0", "step after : is at least 1"),
        ("1,,3", "'(empty)' is not an index"),
        ("", "Give the array's indices"),
        ("   ", "Give the array's indices"),
        ("1-3:2:1", "is not an index or a range"),
        ("0-1000", "the cluster's maximum array size"),
        ("0-9%\u00b2", "after % give how many"),  # a digit to str.isdigit, not to int()
        ("\u0663", "is not an index or a range"),  # Arabic-Indic 3: indices are ASCII digits
    ],
)
def test_bad_arrays_are_refused_saying_what_to_change(text, says):
    with pytest.raises(ArraySpecError, match=None) as refused:
        parse_array(text, max_size=MAX)
    assert says in str(refused.value)


def test_examples_as_slurms_documentation_writes_them():
    assert parse_array("0-15", max_size=MAX).count == 16
    assert parse_array("0,6,16-32", max_size=MAX).indices == (0, 6, *range(16, 33))
    assert parse_array("0-15:4", max_size=MAX).indices == (0, 4, 8, 12)
    spec = parse_array("0-15%4", max_size=MAX)
    assert (spec.count, spec.max_running, spec.text) == (16, 4, "0-15%4")
    assert parse_array("1,1,1-2", max_size=MAX).indices == (1, 2)  # a repeated index is one task
