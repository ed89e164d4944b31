"""Provenance: each invocation of a run appends the commit it ran at, with a dirty flag, to the run folder."""

import subprocess

from pipeline.provenance import SOURCE, code_commit, invocations, record_invocation


def _git(root, *args):
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


def _repo(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    _git(root, "init", "-q")
    (root / "a.py").write_text("x = 1\n")
    _git(root, "add", "a.py")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    return root


def test_the_commit_and_the_dirty_flag_of_the_source_tree(tmp_path):
    root = _repo(tmp_path)
    first = _git(root, "rev-parse", "HEAD")
    assert code_commit(root) == {"commit": first, "dirty": False}
    (root / "untracked.py").write_text("")  # untracked files are not the code that ran
    assert code_commit(root)["dirty"] is False
    (root / "a.py").write_text("x = 2\n")
    assert code_commit(root) == {"commit": first, "dirty": True}
    outside = tmp_path / "not-git"
    outside.mkdir()
    assert code_commit(outside) == {"commit": None, "dirty": None}
    assert len(code_commit(SOURCE)["commit"]) == 40  # this checkout


def test_one_git_process_per_invocation(tmp_path, monkeypatch):
    import pipeline.provenance as provenance

    root, started = _repo(tmp_path), []
    head, run = _git(root, "rev-parse", "HEAD"), subprocess.run
    monkeypatch.setattr(provenance.subprocess, "run", lambda args, **kw: started.append(args) or run(args, **kw))
    (root / "a.py").write_text("x = 2\n")
    assert code_commit(root) == {"commit": head, "dirty": True} and len(started) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    _git(empty, "init", "-q")
    assert code_commit(empty) == {"commit": None, "dirty": None}  # no commit yet


def test_a_resumed_run_appends_its_invocation_and_keeps_the_first(tmp_path):
    root, run_dir = _repo(tmp_path), tmp_path / "run"
    run_dir.mkdir()
    record_invocation(run_dir, resumed=False, root=root)
    first = _git(root, "rev-parse", "HEAD")
    (root / "a.py").write_text("x = 3\n")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "second")
    record_invocation(run_dir, resumed=True, root=root)
    with (run_dir / "commits.jsonl").open("a") as f:
        f.write('{"commit": "cut sh')  # a line a crash cut short
    lines = invocations(run_dir)
    assert [(line["commit"], line["dirty"], line["resumed"]) for line in lines] == [
        (first, False, False), (_git(root, "rev-parse", "HEAD"), False, True)]
    assert all(line["started"].endswith("Z") for line in lines)
    assert invocations(tmp_path / "nowhere") == []
