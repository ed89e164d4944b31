"""ALFWorld adapter: play ALFWorld's text games (`game.tw-pddl`) from a data folder (optional extra `alfworld`).

    pip install 'rollcut[alfworld]'     # alfworld (textworld[pddl] with the fast-downward planner)
    alfworld-download                   # needs internet: fetches json_2.1.1 game files from GitHub releases

Config: `env.name = "alfworld"`, `[env.options] data_dir = ".../json_2.1.1"` (default: `$ALFWORLD_DATA/json_2.1.1`).
The wheel ships only the PDDL domain and grammar, no games; without the download there is nothing to
play, and the suite says so. Splits map to ALFWorld's folders: `train` -> `train`, `heldout_seen` ->
`valid_seen`, `heldout_unseen` -> `valid_unseen`. Task ids are `alfworld/<split>/<task folder>/<trial>`,
families are ALFWorld's six task types under the household names, and the description is worded from
the task folder name ("pick_clean_then_place_in_recep-Mug-None-Cabinet-10" -> "put a clean mug in
cabinet"); the game's own "Your task is to: ..." line comes with the first observation.
Episodes run through `textworld.start` with ALFWorld's name demangler ("cabinet 3", not "cabinet_bar_3"),
admissible commands and the PDDL planner's `policy_commands` as the expert. Expect seconds per reset and
hundreds of milliseconds per step (the PDDL engine is far slower than the household env).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ._game_episode import GameEpisode
from .base import SPLITS, Task

INSTALL_HINT = "the ALFWorld adapter needs the alfworld package: pip install 'rollcut[alfworld]'"
DOWNLOAD_HINT = (
    "ALFWorld game files are not part of the alfworld wheel: run `alfworld-download` (needs internet; it "
    "fetches json_2.1.1 from GitHub releases into $ALFWORLD_DATA) and set [env.options] data_dir to the "
    "json_2.1.1 folder"
)
SPLIT_FOLDERS = {"train": "train", "heldout_seen": "valid_seen", "heldout_unseen": "valid_unseen"}
GAME_FILE = "game.tw-pddl"

FAMILY_OF_TYPE = {
    "pick_and_place_simple": "pick_and_place",
    "look_at_obj_in_light": "look_at_obj_in_light",
    "pick_clean_then_place_in_recep": "pick_clean_then_place",
    "pick_heat_then_place_in_recep": "pick_heat_then_place",
    "pick_cool_then_place_in_recep": "pick_cool_then_place",
    "pick_two_obj_and_place": "pick_two_obj_and_place",
}
_WORDING = {
    "pick_and_place": "put a {obj} in {recep}",
    "look_at_obj_in_light": "look at {obj} under the {recep}",
    "pick_clean_then_place": "put a clean {obj} in {recep}",
    "pick_heat_then_place": "put a hot {obj} in {recep}",
    "pick_cool_then_place": "put a cool {obj} in {recep}",
    "pick_two_obj_and_place": "put two {obj} in {recep}",
}


def default_data_dir() -> Path:
    return Path(os.environ.get("ALFWORLD_DATA", "~/.cache/alfworld")).expanduser() / "json_2.1.1"


def describe_task_folder(name: str) -> tuple[str, str]:
    """(family, description) from an ALFWorld task folder name `<type>-<Object>-<Movable>-<Receptacle>-<scene>`."""
    parts = name.split("-")
    family = FAMILY_OF_TYPE.get(parts[0])
    if family is None or len(parts) < 5:
        raise ValueError(f"{name!r} is not an ALFWorld task folder (<type>-<Object>-<Movable>-<Receptacle>-<scene>)")
    return family, _WORDING[family].format(obj=parts[1].lower(), recep=parts[3].lower())


def write_game(path: str | Path, pddl_problem: str, description: str) -> Path:
    """Write an ALFWorld-format `game.tw-pddl` for a hand-authored PDDL problem (offline).

    Uses the PDDL domain and text grammar shipped in the alfworld wheel; `description` becomes the
    "Your task is to: ..." line (without the final period).
    """
    import importlib.resources

    _import_alfworld()
    data = importlib.resources.files("alfworld") / "data"
    grammar = (data / "alfred.twl2").read_text().replace("UNKNOWN GOAL", description)
    game = {"pddl_domain": (data / "alfred.pddl").read_text(), "grammar": grammar, "pddl_problem": pddl_problem}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(game))
    return out


def game_words(game: Path) -> set[str]:
    """Words a game can print or accept: its grammar's texts and its object and receptacle type names."""
    data = json.loads(game.read_text())
    texts = re.findall(r'"rhs":\s*"((?:[^"\\]|\\.)*)"', data.get("grammar", ""))
    words = set()
    for text in texts:
        text = re.sub(r"#[^#]*#|\{[^}]*\}|\\n", " ", text).lower()
        words.update(re.findall(r"[a-z]+|[.,:]", text))
    words.update(name.lower() for name in re.findall(r"\b([A-Za-z]+)Type\b", data.get("pddl_problem", "")))
    return words


def _import_alfworld():
    """textworld, the PDDL backend and ALFWorld's demangler wrapper, or an ImportError saying what to install."""
    try:
        import textworld
        import textworld.envs.pddl  # noqa: F401 - the backend `.tw-pddl` games need
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
    return textworld, AlfredDemangler


def _start_game(game: Path, policy_commands: bool = False):
    """Start one ALFWorld game in TextWorld's PDDL backend, names demangled ("cabinet 3")."""
    textworld, demangler = _import_alfworld()
    infos = textworld.EnvInfos(admissible_commands=True, won=True, policy_commands=policy_commands)
    return textworld.start(str(game), request_infos=infos, wrappers=[demangler])


class AlfWorldSuite:
    """ALFWorld games under `data_dir` as tasks (its `Options`: the `[env.options]` table)."""

    name = "alfworld"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        data_dir: str | None = None
        """The json_2.1.1 folder (None: `$ALFWORLD_DATA/json_2.1.1`)."""
        families: list[str] | None = None
        """Restrict the task types (None: all six)."""

    def __init__(self, options: Options = Options(), *, max_steps: int = 30):  # noqa: B008 (a frozen Struct)
        self.max_steps = max_steps
        self.data_dir = Path(options.data_dir).expanduser() if options.data_dir else default_data_dir()
        self.families = tuple(options.families) if options.families else tuple(FAMILY_OF_TYPE.values())
        if not self.data_dir.is_dir():
            raise FileNotFoundError(f"ALFWorld data folder {self.data_dir} does not exist. {DOWNLOAD_HINT}")
        self._games = {split: self._find(split) for split in SPLITS}
        if not any(self._games.values()):
            raise FileNotFoundError(f"no {GAME_FILE} files under {self.data_dir}/{{train,valid_seen,valid_unseen}}. {DOWNLOAD_HINT}")
        _import_alfworld()
        self._tasks: dict[str, list[Task]] = {}
        self._by_id: dict[str, Path] = {}
        self._plans: dict[str, list[str]] = {}

    def _find(self, split: str) -> list[Path]:
        folder = self.data_dir / SPLIT_FOLDERS[split]
        return sorted(folder.glob(f"*/*/{GAME_FILE}")) if folder.is_dir() else []

    def tasks(self, split: str) -> Sequence[Task]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
        if split not in self._tasks:
            tasks = []
            for game in self._games[split]:
                family, description = describe_task_folder(game.parent.parent.name)
                if family not in self.families:
                    continue
                task_id = f"alfworld/{split}/{game.parent.parent.name}/{game.parent.name}"
                scene = game.parent.parent.name.rsplit("-", 1)[-1]
                features = {
                    "family_index": float(list(FAMILY_OF_TYPE.values()).index(family)),
                    "scene": float(scene) if scene.isdigit() else -1.0,
                }
                tasks.append(Task(task_id, family, description, split, features))
                self._by_id[task_id] = game
            self._tasks[split] = tasks
        return self._tasks[split]

    def game_file(self, task: Task) -> Path:
        if task.task_id not in self._by_id and task.split in SPLITS:
            self.tasks(task.split)
        try:
            return self._by_id[task.task_id]
        except KeyError:
            raise ValueError(f"{task.task_id!r} is not an ALFWorld game under {self.data_dir}") from None

    def make(self) -> GameEpisode:
        return GameEpisode(game_file=self.game_file, start=_start_game, max_steps=self.max_steps)

    def expert(self, task: Task) -> list[str]:
        """The PDDL planner's plan from the initial state (computed once per task, takes seconds)."""
        if task.task_id not in self._plans:
            game_env = _start_game(self.game_file(task), policy_commands=True)
            try:
                self._plans[task.task_id] = list(game_env.reset()["policy_commands"] or [])
            finally:
                game_env.close()
        return list(self._plans[task.task_id])

    def vocabulary(self) -> list[str]:
        """Best effort (tokenizers need an unknown-word fallback): every game's grammar texts and type
        names, the household vocabulary (ALFWorld's phrasing) and the numbers 1..50."""
        from .household.text import vocabulary as household_vocabulary

        words = set(household_vocabulary()) | {str(number) for number in range(1, 51)}
        for game in sorted({game for games in self._games.values() for game in games}):
            words |= game_words(game)
        return sorted(words)
