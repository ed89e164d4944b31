"""Run folders: a run never takes an existing folder, and a caller can know the folder it will get."""

from pipeline.config import load_config
from pipeline.rundir import create_run_dir, free_run_name


def test_the_free_name_skips_taken_folders_and_is_the_one_the_run_gets(tmp_path):
    assert free_run_name(tmp_path, "learn-s0") == "learn-s0"
    (tmp_path / "learn-s0").mkdir()
    (tmp_path / "learn-s0-2").mkdir()
    assert free_run_name(tmp_path, "learn-s0") == "learn-s0-3"
    cfg = load_config(None, [f'run.out="{tmp_path}"', 'run.name="learn-s0"'])
    assert create_run_dir(cfg) == tmp_path / "learn-s0-3"
