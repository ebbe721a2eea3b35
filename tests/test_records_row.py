"""The SQLite writer's row of a record (gateway/records/store_sqlite.py `_row`) is the record's value for
each column in order, None where it has none: exactly the `.get` per column it replaced."""

from __future__ import annotations

import operator

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.records.record import FIELDS
from gateway.records.store_sqlite import _row

COLUMNS = list(FIELDS)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(COLUMNS + ["extra"]), st.one_of(st.none(), st.integers(), st.text(max_size=5)),
                       max_size=len(COLUMNS) + 1),
       st.booleans())
def test_row_reads_as_get_per_column(record: dict, whole: bool) -> None:
    if whole:  # a record from build_record: every column present
        record = ({c: record.get(c, i) for i, c in enumerate(COLUMNS)}
                  | {k: v for k, v in record.items() if k == "extra"})
    assert _row(record, operator.itemgetter(*COLUMNS), COLUMNS) == tuple(record.get(c) for c in COLUMNS)
