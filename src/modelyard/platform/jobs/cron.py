"""Cron expressions as Vertex AI's schedules take them: five fields (minute, hour, day of month, month, day
of week), each ``*``, a number, a range ``a-b``, a step ``*/n`` or ``a-b/n``, or a comma list of those;
month and weekday names (``JAN``, ``MON``); weekday 7 is Sunday as 0 is; the ``@hourly``, ``@daily``
(``@midnight``), ``@weekly``, ``@monthly`` and ``@yearly`` (``@annually``) shorthands; and an optional
``TZ=Area/City`` or ``CRON_TZ=Area/City`` prefix (an IANA zone; UTC without one).

As in Vixie cron (and so in Cloud Scheduler), when both day fields are restricted a day matches if
either does (``0 0 1 * MON``: the 1st and every Monday). Times are wall-clock times in the zone: a
time a daylight-saving change skips does not happen that day, and one it repeats happens once (the
first). No cron library is a dependency of the platform; this is the small part of one it needs.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from modelyard.platform.api.errors import ApiError

_MONTHS = {m: i for i, m in enumerate(("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT",
                                       "NOV", "DEC"), 1)}
_DAYS = {d: i for i, d in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
           "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
# (name, lowest, highest, names) of the five fields, in order.
_FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}), ("month", 1, 12, _MONTHS),
           ("day of week", 0, 7, _DAYS))
_SEARCH_DAYS = 366 * 8 + 2  # the longest gap between matches: Feb 29 on a given weekday repeats within 28 years,
# but Feb 29 alone within 8 (1 Mar 2096 -> 29 Feb 2104); a weekday-restricted leap day is searched this far too


class CronError(ApiError):
    def __init__(self, cron: str, why: str) -> None:
        super().__init__("INVALID_ARGUMENT", f"Invalid cron {cron!r}: {why}")


@dataclass(frozen=True)
class Cron:
    """A parsed expression: the allowed values of each field, and the zone its times are in."""
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month is *
    any_weekday: bool  # day of week is *
    zone: ZoneInfo | timezone

    def _day_matches(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        by_day, by_weekday = d.day in self.days, (d.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:  # one restricted (or neither): that one decides
            return by_day and by_weekday
        return by_day or by_weekday  # both restricted: either, as Vixie cron does

    def next_after(self, t: float) -> float | None:
        """The first time strictly after ``t`` (epoch seconds) the expression fires, or None if none within
        the search horizon (an expression such as ``0 0 30 2 *`` never fires)."""
        start = datetime.fromtimestamp(t, self.zone)
        day = start.date()
        for _ in range(_SEARCH_DAYS):
            if self._day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        when = datetime(day.year, day.month, day.day, hour, minute, tzinfo=self.zone)
                        back = when.astimezone(timezone.utc).astimezone(self.zone)
                        if (back.hour, back.minute) != (hour, minute):
                            continue  # a wall time the zone skips (spring forward)
                        if when.timestamp() > t:
                            return when.timestamp()
            day += timedelta(days=1)
        return None


def _values(cron: str, part: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    def number(text: str) -> int:
        text = text.strip().upper()
        if text in names:
            return names[text]
        if not text.isdigit():
            raise CronError(cron, f"{text!r} is not a number of the {name} field ({low}-{high})")
        value = int(text)
        if not low <= value <= high:
            raise CronError(cron, f"{value} is outside the {name} field's range {low}-{high}")
        return value

    out: set[int] = set()
    for item in part.split(","):
        base, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(cron, f"the step {step_text!r} of the {name} field must be a positive number")
            step = int(step_text)
        if base in ("*", "?"):
            first, last = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            first, last = number(a), number(b)
            if first > last:
                raise CronError(cron, f"the range {base!r} of the {name} field runs backwards")
        else:
            first = number(base)
            last = high if step_text else first  # "5/15": from 5 to the end, every 15
        out.update(range(first, last + 1, step))
    return out


def parse(text: str) -> Cron:
    """The expression ``text`` (INVALID_ARGUMENT, naming what is wrong, when it is not one)."""
    if not isinstance(text, str) or not text.strip():
        raise CronError(str(text), "a cron expression is required, e.g. \"0 * * * *\"")
    body = text.strip()
    zone: ZoneInfo | timezone = timezone.utc
    if body.startswith(("TZ=", "CRON_TZ=")):
        prefix, _, body = body.partition(" ")
        name = prefix.split("=", 1)[1]
        try:
            zone = ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise CronError(text, f"{name!r} is not an IANA time zone") from None
        body = body.strip()
    body = _MACROS.get(body.lower(), body)
    parts = body.split()
    if len(parts) != 5:
        raise CronError(text, f"it has {len(parts)} fields; cron takes 5 (minute hour day-of-month month day-of-week)")
    sets = [_values(text, part, *field) for part, field in zip(parts, _FIELDS)]
    weekdays = frozenset(d % 7 for d in sets[4])
    return Cron(text, frozenset(sets[0]), frozenset(sets[1]), frozenset(sets[2]), frozenset(sets[3]), weekdays,
                parts[2] in ("*", "?"), parts[4] in ("*", "?"), zone)
