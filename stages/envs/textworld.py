"""TextWorld adapter: play games compiled by `tw-make` (optional extra `textworld`).

    pip install 'rollcut[textworld]'          # or: pip install textworld
    python -m stages.envs.textworld games/textworld/train 50 --seed 0
    python -m stages.envs.textworld games/textworld/heldout_seen 10 --seed 1000

Config: `env.name = "textworld"`, `[env.options] games_dir = "games/textworld"`.

Splits: when `games_dir` has subfolders named after the splits (`train/`, `heldout_seen/`,
`heldout_unseen/`) each holds its split's games. Otherwise every game of the folder is split by a stable
hash of its file name: `heldout_seen_share` (0.2) of them go to `heldout_seen`, the rest to `train`, and
`heldout_unseen` is empty. Task ids are `textworld/<split>/<file stem>`.

Each game needs the `.json` that `tw-make` writes next to it: task texts, expert walkthroughs and
features are read from it without starting the game. Episodes run through `textworld.start` with
admissible commands; reward is 1 when the game is won. TextWorld's own feedback is passed through (minus
the ASCII-art banner), so invalid commands get TextWorld's answers rather than "Nothing happens.".
`vocabulary()` is TextWorld's `extract_vocab_from_gamefiles` (entity names, descriptions, the Inform 7
verbs and the game's dictionary): good, but not guaranteed complete, so a tokenizer needs an unknown-word
fallback for TextWorld text.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import msgspec
import structlog

from ._game_episode import GameEpisode
from .base import SPLITS, Task

GAME_SUFFIXES = (".z8", ".ulx", ".z5")
log = structlog.get_logger(__name__)
INSTALL_HINT = "the TextWorld adapter needs the textworld package: pip install 'rollcut[textworld]'"
_BANNER_LINE = re.compile(r"^[\s_|\\$/<>]*$")
_STATUS_LINE = re.compile(r"^\s*(?:\S.*?\s{2,})?(?:score:?\s*-?\d+(?:/\d+)?\s*)?moves:?\s*\d+\s*$", re.IGNORECASE)
"""An interpreter status line: `Kitchen        Score: 0  Moves: 3` (room, score, moves)."""
_ROOM_SCORE = re.compile(r"^(-= .+ =-)\s*-?\d+/\d+\s*$")
"""A room header with the score glued on (`-= Kitchen =-0/3`): keep the header."""


def _import_textworld():
    try:
        import textworld
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return textworld


def _stable_fraction(text: str) -> float:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") / 2**64


def clean_feedback(feedback: str) -> str:
    """TextWorld's feedback without the ASCII-art banner lines, the interpreter's status line (room, score,
    moves; tw-make games under textworld 1.7 were not seen to print one, other builds do) and runs of
    blank lines."""
    lines = [_ROOM_SCORE.sub(r"\1", line.rstrip()) for line in feedback.splitlines()]
    kept: list[str] = []
    for line in lines:
        if line.strip() and (_BANNER_LINE.match(line) or _STATUS_LINE.match(line)):
            continue
        if not line.strip() and (not kept or not kept[-1]):
            continue
        kept.append(line.strip())
    return "\n".join(kept).strip()


def read_game_info(game_file: Path) -> dict:
    """Objective, walkthrough and counts from the `.json` that `tw-make` writes beside a game."""
    json_file = game_file.with_suffix(".json")
    if not json_file.is_file():
        raise FileNotFoundError(f"{json_file} is missing: generate games with tw-make, which writes it beside {game_file.name}")
    data = json.loads(json_file.read_text())
    walkthrough = data.get("metadata", {}).get("walkthrough")
    if walkthrough is None:
        walkthrough = [command for quest in data.get("quests", []) for command in quest.get("commands", [])]
    types = [info.get("type") for _, info in data.get("infos", [])]
    return {
        "objective": data.get("objective", "").strip(),
        "walkthrough": list(walkthrough),
        "rooms": sum(1 for kind in types if kind == "r"),
        "objects": sum(1 for kind in types if kind not in ("P", "I", "r", "d")),
        "doors": sum(1 for kind in types if kind == "d"),
        "quests": len(data.get("quests", [])),
    }


def find_games(games_dir: Path, heldout_seen_share: float = 0.2) -> dict[str, list[Path]]:
    """Game files per split (see the module docstring for the two folder layouts)."""
    if not games_dir.is_dir():
        raise FileNotFoundError(
            f"TextWorld games folder {games_dir} does not exist; make games with "
            f"`python -m stages.envs.textworld {games_dir}/train 50` (needs {INSTALL_HINT.split(': ')[1]})"
        )

    def games_in(folder: Path) -> list[Path]:
        return sorted(path for path in folder.iterdir() if path.suffix in GAME_SUFFIXES)

    if any((games_dir / split).is_dir() for split in SPLITS):
        return {split: games_in(games_dir / split) if (games_dir / split).is_dir() else [] for split in SPLITS}
    games = games_in(games_dir)
    held = [game for game in games if _stable_fraction(game.name) < heldout_seen_share]
    return {"train": [game for game in games if game not in held], "heldout_seen": held, "heldout_unseen": []}


def generate_games(
    out_dir: str | Path,
    count: int,
    seed: int = 0,
    world_size: int = 3,
    nb_objects: int = 4,
    quest_length: int = 3,
    extra_args: Sequence[str] = (),
) -> list[Path]:
    """Compile `count` games with `tw-make custom` (offline; seeds seed..seed+count-1) into `out_dir`."""
    _import_textworld()
    tw_make = Path(sys.executable).with_name("tw-make")
    command = str(tw_make) if tw_make.exists() else shutil.which("tw-make")
    if command is None:
        raise FileNotFoundError(f"tw-make not found next to {sys.executable} or on PATH; {INSTALL_HINT}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for game_seed in range(seed, seed + count):
        path = out / f"tw-{game_seed:06d}.z8"
        if not path.exists():
            subprocess.run(
                [command, "custom", "--world-size", str(world_size), "--nb-objects", str(nb_objects),
                 "--quest-length", str(quest_length), "--seed", str(game_seed), "--output", str(path),
                 "--silent", "--force", *extra_args],
                check=True, capture_output=True, text=True,
            )
        paths.append(path)
    return paths


def _start_game(game: Path):
    textworld = _import_textworld()
    infos = textworld.EnvInfos(admissible_commands=True, won=True, lost=True, objective=True)
    return textworld.start(str(game), request_infos=infos)


def _lost(state) -> dict[str, bool]:
    return {"lost": bool(state["lost"])}


class TextWorldSuite:
    """Games in `games_dir` as tasks (its `Options`: the `[env.options]` table)."""

    name = "textworld"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        games_dir: str = "games/textworld"
        heldout_seen_share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.2
        """Share of a flat games folder's games that become `heldout_seen` (per-split subfolders win)."""

    def __init__(self, options: Options = Options(), *, max_steps: int = 30):  # noqa: B008 (a frozen Struct)
        self.max_steps = max_steps
        self.games_dir = Path(options.games_dir)
        self._games = find_games(self.games_dir, options.heldout_seen_share)
        if not any(self._games.values()):
            raise FileNotFoundError(f"no {'/'.join(GAME_SUFFIXES)} games in {self.games_dir}")
        empty = [split for split in SPLITS if not self._games[split]]
        if empty:
            log.warning(
                "textworld.empty_split", games_dir=str(self.games_dir), empty=empty,
                hint=f"give each split its own folder: {self.games_dir}/train, {self.games_dir}/heldout_seen, "
                f"{self.games_dir}/heldout_unseen (python -m stages.envs.textworld FOLDER COUNT --seed S)",
            )
        self._tasks: dict[str, list[Task]] = {}
        self._by_id: dict[str, tuple[Path, list[str]]] = {}

    def tasks(self, split: str) -> Sequence[Task]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
        if split not in self._tasks:
            tasks = []
            for game in self._games[split]:
                info = read_game_info(game)
                task_id = f"textworld/{split}/{game.stem}"
                features = {key: float(info[key]) for key in ("rooms", "objects", "doors", "quests")}
                features["expert_steps"] = float(len(info["walkthrough"]))
                tasks.append(Task(task_id, "textworld", info["objective"], split, features))
                self._by_id[task_id] = (game, info["walkthrough"])
            self._tasks[split] = tasks
        return self._tasks[split]

    def _entry(self, task: Task) -> tuple[Path, list[str]]:
        if task.task_id not in self._by_id and task.split in SPLITS:
            self.tasks(task.split)
        try:
            return self._by_id[task.task_id]
        except KeyError:
            raise ValueError(f"{task.task_id!r} is not a game of {self.games_dir}") from None

    def game_file(self, task: Task) -> Path:
        return self._entry(task)[0]

    def make(self) -> GameEpisode:
        """One game at a time; switching to another task's game restarts the interpreter."""
        return GameEpisode(game_file=self.game_file, start=_start_game, max_steps=self.max_steps,
                           text=clean_feedback, extra_info=_lost)

    def expert(self, task: Task) -> list[str]:
        """The game's walkthrough (written by tw-make)."""
        return list(self._entry(task)[1])

    def vocabulary(self) -> list[str]:
        _import_textworld()
        from textworld.text_utils import extract_vocab_from_gamefiles

        games = sorted({str(game) for games in self._games.values() for game in games})
        return sorted(extract_vocab_from_gamefiles(games) | {".", ",", ":", "?", "!"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Generate TextWorld games offline with tw-make custom.")
    parser.add_argument("out_dir")
    parser.add_argument("count", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--nb-objects", type=int, default=4)
    parser.add_argument("--quest-length", type=int, default=3)
    args = parser.parse_args(argv)
    for path in generate_games(args.out_dir, args.count, args.seed, args.world_size, args.nb_objects, args.quest_length):
        print(path)


if __name__ == "__main__":
    main()
