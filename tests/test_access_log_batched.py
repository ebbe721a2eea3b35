"""The access log's shortcut (lines held and written in one go while only its own handler listens)
writes exactly what the logging path writes, in order (gateway/observe/access_log.py)."""

from __future__ import annotations

import logging
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.observe.access_log import AccessLog, AccessLogSettings, log
from gateway.core.exchange import Exchange

odd = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)


def _exchange(rid: str, model: str, status: int) -> Exchange:
    ex = Exchange(rid)
    ex.status, ex.public_model, ex.started_wall = status, model, 1.0
    return ex


class _Heard(logging.Handler):
    """Another handler on the access logger: what it hears."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _fresh_logger() -> tuple[list, list]:
    saved = (list(log.handlers), list(log.filters))
    for h in list(log.handlers):
        log.removeHandler(h)
    return saved


def _restore(saved: tuple[list, list]) -> None:
    for h in list(log.handlers):
        log.removeHandler(h)
    for h in saved[0]:
        log.addHandler(h)
    log.filters[:] = saved[1]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(odd, odd, st.sampled_from([200, 404, 503])), min_size=1, max_size=12),
       st.sampled_from(["json", "text"]), st.integers(0, 12), st.integers(0, 12))
def test_held_lines_read_as_logged_lines(rows, fmt: str, general_from: int, general_to: int) -> None:
    """Lines written while another handler listens take log.info; the rest are held; the file reads
    the lines, in order, one a line, whichever way each went."""
    import tempfile

    saved = _fresh_logger()
    path = Path(tempfile.mkdtemp()) / "access.log"
    extra = _Heard()
    try:
        sink = AccessLog(AccessLogSettings(format=fmt, path=str(path)))
        expected = []
        for i, (rid, model, status) in enumerate(rows):
            general = general_from <= i < general_to
            if general and extra not in log.handlers:
                log.addHandler(extra)
            elif not general and extra in log.handlers:
                log.removeHandler(extra)
            ex = _exchange(rid, model, status)
            heard = len(extra.records)
            sink(ex, None)
            # While another handler listens the line takes log.info (that handler hears it); else it is held.
            assert (len(extra.records) > heard) is general
            from gateway.observe.access_log import _text, access_fields
            import orjson
            f = access_fields(ex)
            expected.append(orjson.dumps(f).decode() if fmt == "json" else _text(f))
        sink.flush()
        assert path.read_text(encoding="utf-8") == "".join(line + "\n" for line in expected)
    finally:
        _restore(saved)


def test_a_level_above_info_writes_nothing() -> None:
    import tempfile

    saved = _fresh_logger()
    level = log.level
    path = Path(tempfile.mkdtemp()) / "access.log"
    try:
        sink = AccessLog(AccessLogSettings(path=str(path)))
        log.setLevel(logging.WARNING)
        sink(_exchange("a", "m", 200), None)
        sink.flush()
        assert path.read_text() == ""
    finally:
        log.setLevel(level)
        _restore(saved)
