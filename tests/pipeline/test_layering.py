"""pipeline/'s mechanism modules know nothing about stages/, gates/ or learner/ (composition roots aside)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSITION_ROOTS = {"pipeline/grpo.py", "pipeline/job.py", "pipeline/job_summary.py"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_mechanism_modules_do_not_import_upper_layers():
    offenders = {}
    for path in (ROOT / "pipeline").rglob("*.py"):
        rel = str(path.relative_to(ROOT))
        if rel in COMPOSITION_ROOTS:
            continue
        upper = _imports(path) & {"stages", "gates", "learner"}
        if upper:
            offenders[rel] = sorted(upper)
    assert offenders == {}
