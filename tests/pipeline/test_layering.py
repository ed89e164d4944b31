"""Contracts below, composition above: no import arrow runs back up the layers.

* only pipeline/run/ (the run: where a config becomes components and the phases run) imports stages/,
  gates/ or learner/; every other module of pipeline/ is mechanism those folders may import;
* nothing outside pipeline/run/ imports it (stages/, gates/ and learner/ are what it assembles);
* gates/ and learner/ never import stages/ (the contracts they share with stages/ — `Task`, `Admission`,
  `GateDecision`, `TrainableModel` — live in `pipeline.contracts`).

Every import counts, also one inside a function or under `if TYPE_CHECKING:`.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULES = {
    "pipeline": {"stages", "gates", "learner"},
    "stages": {"pipeline.run"},
    "gates": {"stages", "pipeline.run"},
    "learner": {"stages", "pipeline.run"},
}
THE_RUN = "pipeline/run/"
"""The one folder of pipeline/ that assembles stages/, gates/ and learner/."""


def _imports(source: str) -> set[str]:
    """The top-level packages imported, and `pipeline.run` when the run's folder is."""
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {m.split(".")[0] for m in modules} | {"pipeline.run" for m in modules if m.split(".")[:2] == ["pipeline", "run"]}


def offenders(root: Path) -> dict[str, list[str]]:
    """{module: [forbidden top-level packages it imports]} under `root`."""
    found = {}
    for folder, forbidden in RULES.items():
        for path in (root / folder).rglob("*.py"):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(THE_RUN):
                continue
            upper = _imports(path.read_text()) & forbidden
            if upper:
                found[rel] = sorted(upper)
    return found


def test_no_import_runs_back_up_the_layers():
    assert offenders(ROOT) == {}


def test_the_check_finds_an_arrow_that_runs_back_up(tmp_path):
    for folder, source in {
        "pipeline": "def f():\n    from gates import GATES\n",
        "gates": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import stages.envs.base\n",
        "learner": "from stages.policy.base import TrainableModel\n",
        "stages": "from pipeline import run\n",
    }.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "bad.py").write_text(source)
    (tmp_path / "pipeline" / "run").mkdir()
    (tmp_path / "pipeline" / "run" / "grpo.py").write_text("import stages\n")  # the run may
    (tmp_path / "pipeline" / "job.py").write_text("import learner\n")  # a module outside pipeline/run/ may not
    (tmp_path / "learner" / "fine.py").write_text("from pipeline.contracts import TrainableModel\nfrom . import losses\n")
    assert offenders(tmp_path) == {"pipeline/bad.py": ["gates"], "pipeline/job.py": ["learner"], "gates/bad.py": ["stages"], "learner/bad.py": ["stages"],
                                  "stages/bad.py": ["pipeline.run"]}
