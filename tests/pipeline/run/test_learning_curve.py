from pipeline.run.learning_curve import curve_points, write_learning_curve


def test_points_start_at_the_warm_start_and_follow_the_periodic_rows():
    rows = [
        {"iteration": 5, "wall_s": 60.0, "env_steps": 4000, "heldout/seen": 0.3, "heldout/unseen": 0.2, "heldout/mean": 0.25},
        {"iteration": 5, "wall_s": 61.0, "env_steps": 4100, "learner/loss": 0.1},  # an update row: no point
    ]
    points = curve_points({"heldout_seen": 0.2, "heldout_unseen": 0.1}, rows, {"heldout_seen": 0.4},
                          final_wall_s=120.0, final_env_steps=9000, measure_range="dev", curve_range="dev")
    assert points["seen (dev)"] == [(0.0, 0.0, 0.2), (60.0, 4000, 0.3), (120.0, 9000.0, 0.4)]
    assert points["unseen (dev)"] == [(0.0, 0.0, 0.1), (60.0, 4000, 0.2)]


def test_measures_of_different_task_ranges_are_separate_series():
    rows = [{"iteration": 5, "wall_s": 60.0, "env_steps": 4000, "heldout/seen": 0.3, "heldout/mean": 0.3, "heldout_range": "valid"}]
    points = curve_points({"heldout_seen": 0.2}, rows, {"heldout_seen": 0.4}, final_wall_s=120.0, final_env_steps=9000,
                          measure_range="test", curve_range="valid")
    assert points == {"seen (test)": [(0.0, 0.0, 0.2), (120.0, 9000.0, 0.4)], "seen (valid)": [(60.0, 4000, 0.3)]}


def test_the_png_is_written(tmp_path):
    assert write_learning_curve(tmp_path / "c.png", {"seen": [(0.0, 0.0, 0.2), (10.0, 100.0, 0.3)]}, "t")
    assert (tmp_path / "c.png").stat().st_size > 1000
