"""Contracts below, composition above: no import arrow runs back up the layers.

* pipeline/'s mechanism modules know nothing about stages/, gates/ or learner/ (the composition roots,
  which assemble those folders, aside);
* gates/ and learner/ never import stages/ (the contracts they share with stages/ — `Task`, `Admission`,
  `GateDecision`, `TrainableModel` — live in `pipeline.contracts`).

Every import counts, also one inside a function or under `if TYPE_CHECKING:`.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSITION_ROOTS = {"pipeline/grpo.py", "pipeline/job.py", "pipeline/job_summary.py", "pipeline/processes.py"}
RULES = {"pipeline": {"stages", "gates", "learner"}, "gates": {"stages"}, "learner": {"stages"}}


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def offenders(root: Path) -> dict[str, list[str]]:
    """{module: [forbidden top-level packages it imports]} under `root`."""
    found = {}
    for folder, forbidden in RULES.items():
        for path in (root / folder).rglob("*.py"):
            rel = path.relative_to(root).as_posix()
            if rel in COMPOSITION_ROOTS:
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
    }.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "bad.py").write_text(source)
    (tmp_path / "pipeline" / "grpo.py").write_text("import stages\n")  # a composition root may
    (tmp_path / "learner" / "fine.py").write_text("from pipeline.contracts import TrainableModel\nfrom . import losses\n")
    assert offenders(tmp_path) == {"pipeline/bad.py": ["gates"], "gates/bad.py": ["stages"], "learner/bad.py": ["stages"]}
