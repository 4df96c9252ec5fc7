"""Pure rule logic with literal samples: duration, hysteresis, cooldown, stall from PSI totals."""

from sparkd.watch.rules import CLEAR, COOLDOWN, FIRE, Cooldown, CounterRate, LevelCondition, StallWindow


def run(cond, samples):
    """samples: (time, exceeded, cleared) -> the non-None outcomes with their times."""
    return [(t, out) for t, e, c in samples if (out := cond.update(t, e, c)) is not None]


def test_fires_only_after_the_duration_without_a_break():
    cond = LevelCondition(duration_seconds=5, clear_for_seconds=1, cooldown_seconds=0)
    # exceeded at 0..3, a break at 4, exceeded again from 5: fires at 10, not at 5
    samples = [(t, t != 4, False) for t in range(0, 12)]
    assert run(cond, samples) == [(10, FIRE)]


def test_zero_duration_fires_on_the_first_sample():
    cond = LevelCondition(0, 1, 0)
    assert cond.update(0.0, True, False) == FIRE


def test_hysteresis_stays_active_between_the_levels_and_clears_after_clear_for():
    cond = LevelCondition(0, clear_for_seconds=3, cooldown_seconds=0)
    assert cond.update(0, True, False) == FIRE
    # not exceeded but not below the clear level either: still active, nothing happens
    assert run(cond, [(t, False, False) for t in range(1, 10)]) == []
    assert cond.active
    # below the clear level, with one interruption that restarts the clear timer
    assert run(cond, [(10, False, True), (11, False, True), (12, False, False), (13, False, True),
                      (15, False, True), (16, False, True)]) == [(16, CLEAR)]
    assert not cond.active


def test_cooldown_suppresses_a_second_episode_once_then_allows_after_it():
    cond = LevelCondition(0, clear_for_seconds=0, cooldown_seconds=30)
    assert cond.update(0, True, False) == FIRE
    assert cond.update(1, False, True) == CLEAR
    # second episode inside the cooldown: reported once, not repeated every sample
    assert run(cond, [(t, True, False) for t in range(5, 10)]) == [(5, COOLDOWN)]
    assert cond.update(31, True, False) == FIRE


def test_edge_cooldown():
    cd = Cooldown(10)
    assert [cd.allow(t) for t in (0, 5, 9.9, 10, 15, 21)] == [True, False, False, True, False, True]


def test_edge_cooldown_notes_one_refusal_per_cooldown():
    cd = Cooldown(10)
    notes = []
    for t in (0, 1, 2, 3, 10, 11, 12):
        notes.append("act" if cd.allow(t) else ("note" if cd.first_refusal() else "quiet"))
    assert notes == ["act", "note", "quiet", "quiet", "act", "note", "quiet"]


def test_stall_window_from_totals():
    w = StallWindow(window_seconds=1.0)
    assert w.add(0.0, 0) is None
    # 300 ms stalled in one second
    assert abs(w.add(1.0, 300_000) - 0.3) < 1e-9
    # half a second later 100 ms more: rate over [0.0, 1.5]... the start moves once a sample is a
    # window old: at t=2.0, the rate over [1.0, 2.0]
    w.add(1.5, 400_000)
    assert abs(w.add(2.0, 400_000) - 0.1) < 1e-9
    # totals never go backwards in the kernel; a reset (new cgroup) does not give a negative stall
    assert w.add(3.0, 0) == 0.0


def test_counter_rate_per_second_over_the_window():
    r = CounterRate(window_seconds=2.0)
    assert r.add(0.0, 10) is None
    assert r.add(1.0, 110) == 100.0  # history shorter than the window: the rate since the first sample
    assert r.add(2.0, 160) == 75.0  # (160 - 10) / 2
    assert r.add(3.0, 160) == 25.0  # over [1, 3]: (160 - 110) / 2
    assert r.add(5.0, 160) == 0.0
    assert r.add(6.0, 3) == 0.0  # a new cgroup starts from 0: never a negative rate
