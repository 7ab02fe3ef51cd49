"""hvdcompress.transport.waiting: the engine's wait polls with pauses that follow the time waited, within
bounds, instead of spinning; HVDCOMPRESS_WAIT_PAUSE_US sets the cap (0: the framework's wait)."""
from __future__ import annotations

import pytest

from hvdcompress.transport import waiting


class FakeTime:
    """A clock that advances only when slept on, recording each pause."""

    def __init__(self):
        self.now, self.pauses = 0.0, []

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def wait_for(seconds_until_done: float, monkeypatch, cap_us=None) -> FakeTime:
    if cap_us is not None:
        monkeypatch.setenv(waiting.VARIABLE, str(cap_us))
    fake = FakeTime()   # its clock starts at 0: the time waited is its reading
    waiting.wait_politely(lambda: fake.now >= seconds_until_done, fake.sleep, fake.clock)
    return fake


def reference_pauses(seconds_until_done: float, cap: float) -> list:
    """The pauses the module doc gives: min(cap, max(first, share * waited)) until done."""
    waited, out = 0.0, []
    while waited < seconds_until_done:
        out.append(min(cap, max(waiting.FIRST_PAUSE_S, waiting.SHARE * waited)))
        waited += out[-1]
    return out


def test_a_handle_already_done_costs_no_sleep(monkeypatch):
    monkeypatch.delenv(waiting.VARIABLE, raising=False)
    assert wait_for(0.0, monkeypatch).pauses == []


@pytest.mark.parametrize("seconds, cap_us", [(0.0015, None), (2.0, None), (0.3, 50_000), (0.00001, 5)])
def test_pauses_follow_the_time_waited_within_bounds(monkeypatch, seconds, cap_us):
    monkeypatch.delenv(waiting.VARIABLE, raising=False)
    fake = wait_for(seconds, monkeypatch, cap_us)
    cap = (waiting.DEFAULT_CAP_US if cap_us is None else cap_us) * 1e-6
    assert fake.pauses == pytest.approx(reference_pauses(seconds, cap))
    assert max(fake.pauses) <= cap
    late = sum(fake.pauses) - seconds          # how long after completion the wait returned
    assert late <= max(waiting.SHARE * seconds, waiting.FIRST_PAUSE_S) + 1e-12 or late <= cap


def test_a_long_wait_sleeps_at_the_cap_and_polls_rarely(monkeypatch):
    monkeypatch.delenv(waiting.VARIABLE, raising=False)
    fake = wait_for(5.0, monkeypatch)
    assert fake.pauses[-1] == pytest.approx(waiting.DEFAULT_CAP_US * 1e-6)
    assert len(fake.pauses) < 5.0 / (waiting.DEFAULT_CAP_US * 1e-6) + 100   # ~5,000 polls, not millions


def test_cap_zero_returns_at_once_for_the_framework_to_wait(monkeypatch):
    monkeypatch.setenv(waiting.VARIABLE, "0")
    calls = []
    waiting.wait_politely(lambda: calls.append(1) or False, lambda s: pytest.fail("slept"))
    assert calls == []


@pytest.mark.parametrize("text", ["-1", "1.5", "fast", ""])
def test_a_bad_cap_is_named(monkeypatch, text):
    monkeypatch.setenv(waiting.VARIABLE, text)
    with pytest.raises(ValueError, match=rf"HVDCOMPRESS_WAIT_PAUSE_US={text!r}: allowed: an integer"):
        waiting.wait_politely(lambda: True)


@pytest.mark.parametrize("text, expected", [("5", 5.0), ("0", 0.0), ("2.5", 2.5), ("-1", None), ("x", None),
                                            ("nan", None)])
def test_the_exit_barriers_bound_shares_the_check(monkeypatch, text, expected):
    """HVDCOMPRESS_EXIT_WAIT_SECONDS goes through the same check (validation.env_number)."""
    from hvdcompress.transport import exit_guard
    monkeypatch.setenv(exit_guard.WAIT_VARIABLE, text)
    if expected is None:
        with pytest.raises(ValueError, match=rf"HVDCOMPRESS_EXIT_WAIT_SECONDS={text!r}: allowed: a number"):
            exit_guard.exit_wait_seconds()
    else:
        assert exit_guard.exit_wait_seconds() == expected
