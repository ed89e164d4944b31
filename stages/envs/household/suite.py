"""`HouseholdSuite`: the registered `household` environment suite (tasks per split, episodes, expert)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Annotated, Literal

import msgspec

from ..base import SPLITS, Task
from . import text
from .catalog import FAMILIES
from .engine import HouseholdEnv
from .expert import plan
from .recovery import next_command
from .splits import SplitConfig, features, generate_split
from .world import TaskSpec


class HouseholdSuite:
    """ALFWorld-like household tasks, generated deterministically from `seed` (its `Options`: the
    `[env.options]` table). Task ids are `household/<split>/<index:06d>`; for a given seed they are the same on every machine,
    and a split's first N tasks do not change when its size (or another split's) grows.
    Splits are generated on first use and cached.
    """

    name = "household"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        seed: int = 0
        train_size: Annotated[int, msgspec.Meta(ge=0)] = 3000
        heldout_seen_size: Annotated[int, msgspec.Meta(ge=0)] = 1200
        heldout_unseen_size: Annotated[int, msgspec.Meta(ge=0)] = 1200
        """Each held-out split holds the four task ranges (`eval.ranges`: dev 200, valid 200, test 400, final 400);
        splits are prefix-stable, so the first 600 tasks are those of the 600-task splits before the ranges existed
        and the first 800 those of the 800-task splits before the final range."""
        layouts_per_room: Annotated[int, msgspec.Meta(ge=1)] = 40
        unseen_layouts_per_room: Annotated[int, msgspec.Meta(ge=1)] = 12
        unseen_combination_share: Annotated[float, msgspec.Meta(gt=0, lt=1)] = 0.2
        heldout_seen_share: Annotated[float, msgspec.Meta(gt=0, lt=1)] = 0.2
        families: tuple[str, ...] = FAMILIES
        """A non-empty subset of the six task families."""
        expert: Literal["searching", "omniscient"] = "omniscient"
        """"searching": explores receptacles in a fixed order and uses only what it has seen; "omniscient":
        walks straight to the goal objects, the shortest plans and the easiest to imitate for a tiny model."""
        recovery: Literal["searching", "omniscient", "mixed"] = "omniscient"
        """Labels of `expert_action` (noise-injected demonstrations, DAgger): "omniscient" fetches the goal
        object wherever it is; "searching" only from where the agent has seen it, else searches on
        (`recovery.next_command(searching=True)`): labels an agent can predict from what it saw; "mixed":
        searching labels for a `searching_share` of the tasks (a fixed, seed-free choice per task),
        omniscient ones for the rest."""
        searching_share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
        """With `recovery = "mixed"`, the share of tasks whose episodes get searching labels."""

        def __post_init__(self) -> None:
            unknown = [family for family in self.families if family not in FAMILIES]
            if unknown or not self.families:
                raise ValueError(f"families must be a non-empty subset of {FAMILIES}, got {list(self.families)}")

    def __init__(self, options: Options = Options(), *, max_steps: int = 30) -> None:  # noqa: B008 (a frozen Struct)
        for option, allowed in (("expert", ("searching", "omniscient")), ("recovery", ("searching", "omniscient", "mixed"))):
            if getattr(options, option) not in allowed:  # a Literal is checked when decoded, not when built in Python
                raise ValueError(f"{option} must be one of {', '.join(map(repr, allowed))}, got {getattr(options, option)!r}")
        self.omniscient = options.expert == "omniscient"
        self.recovery = options.recovery
        """Which labels `expert_action` gives (part of a DAgger warm start's cache key)."""
        self.searching_share = options.searching_share
        if max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        for share in (options.unseen_combination_share, options.heldout_seen_share):
            if not 0.0 < share < 1.0:
                raise ValueError(f"shares must be strictly between 0 and 1, got {share}")
        self.max_steps = max_steps
        self.config = SplitConfig(
            seed=options.seed,
            layouts_per_room=options.layouts_per_room,
            unseen_layouts_per_room=options.unseen_layouts_per_room,
            unseen_combination_share=options.unseen_combination_share,
            heldout_seen_share=options.heldout_seen_share,
            families=tuple(options.families),
        )
        self.sizes = {
            "train": options.train_size, "heldout_seen": options.heldout_seen_size, "heldout_unseen": options.heldout_unseen_size,
        }
        self._specs: dict[str, list[TaskSpec]] = {}
        self._tasks: dict[str, list[Task]] = {}
        self._plans: dict[str, list[list[str]]] = {}

    def _generate(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
        if split in self._tasks:
            return
        specs = generate_split(split, self.sizes[split], self.config)
        plans = [plan(spec, omniscient=self.omniscient, max_steps=self.max_steps) for spec in specs]
        self._specs[split] = specs
        self._plans[split] = plans
        self._tasks[split] = [
            Task(f"household/{split}/{i:06d}", spec.family, spec.description, split, features(spec, commands, max_steps=self.max_steps))
            for i, (spec, commands) in enumerate(zip(specs, plans, strict=True))
        ]

    def tasks(self, split: str) -> Sequence[Task]:
        self._generate(split)
        return self._tasks[split]

    def spec(self, task: Task | str) -> TaskSpec:
        """The full task (layout, object placements, goal) behind a task or task id of this suite."""
        task_id = task if isinstance(task, str) else task.task_id
        split, index = self._locate(task_id)
        return self._specs[split][index]

    def _locate(self, task_id: str) -> tuple[str, int]:
        parts = task_id.split("/")
        if len(parts) != 3 or parts[0] != self.name or parts[1] not in SPLITS or not parts[2].isdigit():
            raise ValueError(f"{task_id!r} is not a household task id (household/<split>/<index>)")
        split, index = parts[1], int(parts[2])
        self._generate(split)
        if index >= len(self._specs[split]):
            raise ValueError(f"{task_id!r}: split {split} has only {len(self._specs[split])} tasks")
        return split, index

    def make(self) -> HouseholdEnv:
        return HouseholdEnv(self.spec, max_steps=self.max_steps)

    def expert(self, task: Task) -> list[str]:
        split, index = self._locate(task.task_id)
        return list(self._plans[split][index])

    def expert_action(self, env: HouseholdEnv) -> str:
        """The recovering expert's next command from `env`'s current state, whatever led there
        (`recovery.next_command`, searching with `options.recovery = "searching"`): the label DAgger and
        noise-injected demonstrations need."""
        if env.spec is None:
            raise ValueError("expert_action needs an episode in progress (call env.reset first)")
        return next_command(env.spec, env.world(), searching=self.searches(env.spec))

    def searches(self, spec: TaskSpec) -> bool:
        """Whether `expert_action` labels episodes of `spec` with the searching expert's commands."""
        if self.recovery != "mixed":
            return self.recovery == "searching"
        digest = hashlib.blake2b(repr(spec.signature).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < self.searching_share

    def vocabulary(self) -> list[str]:
        """Every token of household texts; see `stages.envs.household.text` for the tokenization rule."""
        return text.vocabulary()
