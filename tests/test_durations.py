"""One duration parser for every option: compound forms read, impossible values refused."""

from __future__ import annotations

import math

import pytest

from trt_otel.app.cli import main
from trt_otel.core.durations import (
    MAX_DURATION_S,
    DurationError,
    format_duration,
    parse_duration,
    parse_positive_duration,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("1.5", 1.5),
        ("0", 0.0),
        ("90s", 90.0),
        ("500ms", 0.5),
        ("15m", 900.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1h 30m 15s", 5415.0),
        ("2d", 172_800.0),
        (".5s", 0.5),
        ("1.5H", 5400.0),
        ("  3m ", 180.0),
        ("1m500ms", 60.5),
        ("365d", MAX_DURATION_S),
    ],
)
def test_durations_are_read_alone_and_compound(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("inf", "is not a duration"),
        ("nan", "is not a duration"),
        ("1e400", "is not a duration"),
        ("infs", "is not a duration"),
        ("1hxx30m", "is not a duration"),
        ("1h30", "is not a duration"),
        ("1.2.3s", "is not a duration"),
        ("soon", "is not a duration"),
        ("", "is not a duration"),
        ("-1s", "must be 0 or more"),
        ("-0.5", "must be 0 or more"),
        ("366d", "longer than the limit of 365d"),
        ("9" * 400 + "s", "longer than the limit"),
        ("9" * 400, "longer than the limit"),
    ],
)
def test_impossible_durations_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(DurationError, match=message):
        parse_duration(text)


def test_a_positive_duration_refuses_zero() -> None:
    assert parse_positive_duration("1ms") == pytest.approx(0.001)
    with pytest.raises(DurationError, match="must be longer than 0s"):
        parse_positive_duration("0s")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--timeout", "inf"], "'inf' is not a duration"),
        (["--timeout", "1e400"], "'1e400' is not a duration"),
        (["--timeout", "nan"], "'nan' is not a duration"),
        (["--stall-timeout", "inf"], "'inf' is not a duration"),
        (["--stall-timeout", "-1s"], "'-1s' must be 0 or more"),
        (["--grace", "-2m"], "'-2m' must be 0 or more"),
        (["--timeout", "400d"], "longer than the limit"),
    ],
)
def test_the_command_refuses_them_with_exit_2_before_a_build(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--speed", "0", "--no-progress", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err and "expected one argument" not in err


@pytest.mark.parametrize("text", ["-0", "-0s", "-0ms", "-0.0", "-0m0s", "+0"])
def test_minus_zero_is_zero_where_zero_is_allowed(text: str) -> None:
    seconds = parse_duration(text)
    assert seconds == 0 and math.copysign(1.0, seconds) == 1.0, "0, not -0.0"
    with pytest.raises(DurationError, match="must be longer than 0s"):
        parse_positive_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (59.94, "59.9s"),
        (59.96, "1m00s"),
        (60, "1m00s"),
        (60.4, "1m00s"),
        (119.9, "1m59s"),
        (3599.9, "59m59s"),
        (3600, "1h00m"),
        (3660, "1h01m"),
        (-0.04, "0.0s"),
        (-0.0, "0.0s"),
        (-90, "-1m30s"),
        (9_999 * 3600 + 3599, "9999h59m"),
        (10_000 * 3600, ">9999h"),
        (2**63 / 1e9, ">9999h"),
        (float("nan"), "?"),
        (float("inf"), "?"),
    ],
)
def test_format_duration_around_the_minute(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
