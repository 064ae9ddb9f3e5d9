"""batch-predict's progress lines (issue 44): the 100% line once, and the final state drawn when the last line
did not show it (a total that was an estimate)."""
from __future__ import annotations

import io

from modelyard.batch.progress import Progress


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_the_last_line_is_printed_once():
    stream = io.StringIO()  # not a TTY: a line per draw
    bar = Progress(100, stream=stream)
    bar.advance(40)
    bar.advance(60)  # the end: drawn at once
    bar.close()
    lines = _lines(stream)
    assert sum("100/100 rows" in line for line in lines) == 1, lines
    assert lines[-1].startswith("[" + "#" * 30 + "]"), lines


def test_close_draws_the_exact_total_when_the_last_line_had_an_estimate():
    stream = io.StringIO()
    bar = Progress(100, stream=stream)  # an estimate: the plan is not whole yet
    bar.advance(100)
    bar.total = 120
    bar.advance(20)
    bar.close()
    assert [line.split(" rows")[0].split("] ")[1] for line in _lines(stream)] == ["100/100", "120/120"]


def test_disabled_prints_nothing():
    stream = io.StringIO()
    bar = Progress(10, stream=stream, enabled=False)
    bar.advance(10)
    bar.close()
    assert stream.getvalue() == ""
