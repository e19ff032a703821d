"""bench.regress's verdicts: a figure moved only when its median moved by more than its own repeats' spread."""

from bench.regress import FIGURES, compare, summarize

BASE = {"figures": {"gateway.items_per_s": {"median": 1000.0},
                    "engine.overhead_over_bare": {"median": 0.40},
                    "fence_race.full_conflict_runs": {"median": 0.0}}}


def verdicts(runs: dict[str, list[float]]) -> dict[str, str]:
    return {r["figure"]: r["verdict"] for r in compare({k: summarize(v) for k, v in runs.items()}, BASE)}


def test_a_move_beyond_the_runs_own_spread_is_reported_with_its_direction():
    v = verdicts({"gateway.items_per_s": [1500.0, 1550.0, 1600.0], "engine.overhead_over_bare": [0.60, 0.61, 0.62]})
    assert v == {"gateway.items_per_s": "moved: better", "engine.overhead_over_bare": "MOVED: WORSE"}


def test_a_move_within_the_runs_own_spread_is_noise():
    v = verdicts({"gateway.items_per_s": [700.0, 1200.0, 1400.0], "engine.overhead_over_bare": [0.30, 0.45, 0.55]})
    assert set(v.values()) == {"within noise"}


def test_a_decision_count_that_changes_at_all_is_reported_and_a_new_figure_has_no_baseline():
    v = verdicts({"fence_race.full_conflict_runs": [0.0, 1.0, 0.0], "placement.decide_ms_p50_1024": [20.0]})
    assert v == {"fence_race.full_conflict_runs": "CHANGED", "placement.decide_ms_p50_1024": "no baseline"}
    assert verdicts({"fence_race.full_conflict_runs": [0.0, 0.0, 0.0]}) == {"fence_race.full_conflict_runs": "same"}


def test_every_benchmark_named_by_the_issue_is_covered():
    assert set(FIGURES) == {"gateway", "engine", "mover", "placement", "fence_race"}
