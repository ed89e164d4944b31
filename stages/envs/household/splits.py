"""Splits: which layouts and goal combinations each split may use, and the task streams that fill them.

- Layouts: per room kind, a *seen* pool (used by `train` and `heldout_seen`) and an *unseen* pool drawn
  further down the same seeded stream, skipping any layout whose signature is already seen.
- Goal combinations (family, object kind, target kind): a fixed share of them, chosen by a stable hash,
  is reserved for `heldout_unseen`; `train` and `heldout_seen` never use those.
- Tasks: `train` and `heldout_seen` share one candidate stream over seen layouts and seen combinations;
  a stable hash of each candidate's signature sends it to one split or the other, so the two are disjoint
  and each split's first N tasks do not depend on the other split's size. `heldout_unseen` has its own
  stream over unseen layouts and unseen combinations. Duplicates within a split are skipped.

Every random draw uses a string-seeded `random.Random` and every hash is BLAKE2b, so the task lists and
ids are identical across runs, machines and Python hash seeds.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from .catalog import FAMILIES, RECEPTACLE_KINDS, ROOM_KINDS, ROOM_ORDER
from .expert import goal_instances, plan
from .world import Layout, TaskSpec, combinations_in, generate_layout, generate_task


def stable_fraction(*parts: object) -> float:
    """A number in [0, 1) fixed by `parts` (their repr), the same on every machine."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True, slots=True)
class SplitConfig:
    seed: int = 0
    layouts_per_room: int = 40
    """Seen layouts per room kind (train and heldout_seen draw from them)."""
    unseen_layouts_per_room: int = 12
    unseen_combination_share: float = 0.2
    """Share of (family, object, target kind) combinations reserved for heldout_unseen."""
    heldout_seen_share: float = 0.2
    """Share of the seen candidate stream that goes to heldout_seen instead of train."""
    families: tuple[str, ...] = FAMILIES


def is_unseen_combination(combo: tuple[str, str, str], config: SplitConfig) -> bool:
    return stable_fraction("combination", config.seed, combo) < config.unseen_combination_share


@lru_cache(maxsize=8)
def layout_pools(config: SplitConfig) -> tuple[dict[str, list[Layout]], dict[str, list[Layout]]]:
    """(seen, unseen) layouts per room kind; no unseen layout has a seen layout's signature."""
    seen: dict[str, list[Layout]] = {}
    unseen: dict[str, list[Layout]] = {}
    for room in ROOM_ORDER:
        slug = room.replace(" ", "")
        signatures: set[tuple] = set()
        pools: tuple[list[Layout], list[Layout]] = ([], [])
        wanted = (config.layouts_per_room, config.unseen_layouts_per_room)
        k = 0
        for pool, want, tag in zip(pools, wanted, ("s", "u"), strict=True):
            attempts = 0
            while len(pool) < want:
                rng = random.Random(f"household:{config.seed}:layout:{room}:{k}")
                k += 1
                attempts += 1
                if attempts > 100 * want + 100:
                    raise ValueError(f"cannot draw {want} distinct {room} layouts; ask for fewer")
                layout = generate_layout(room, f"{slug}-{tag}{len(pool):03d}", rng)
                if layout.signature not in signatures:
                    signatures.add(layout.signature)
                    pool.append(layout)
        seen[room], unseen[room] = pools
    return seen, unseen


@lru_cache(maxsize=16)
def _usable_combinations(config: SplitConfig, unseen: bool) -> dict[tuple[str, str], list[tuple[str, str, str]]]:
    """(layout id, family) -> the combinations a task of that family may have there, for one side."""
    seen_pools, unseen_pools = layout_pools(config)
    usable: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for pool in (unseen_pools if unseen else seen_pools).values():
        for layout in pool:
            for combo in combinations_in(layout):
                if is_unseen_combination(combo, config) == unseen:
                    usable.setdefault((layout.layout_id, combo[0]), []).append(combo)
    return usable


def _candidates(
    stream: str, layouts: dict[str, list[Layout]], unseen: bool, config: SplitConfig
) -> Iterator[TaskSpec]:
    """An endless stream of tasks cycling through the families, each in a random fitting layout."""
    rooms_for = {f: [r for r in ROOM_ORDER if f in ROOM_KINDS[r].families and layouts[r]] for f in config.families}
    for family, rooms in rooms_for.items():
        if not rooms:
            raise ValueError(f"no room supports family {family!r}")
    usable = _usable_combinations(config, unseen)
    i = 0
    failures = 0
    while True:
        family = config.families[i % len(config.families)]
        rng = random.Random(f"household:{config.seed}:{stream}:{i}")
        i += 1
        layout = rng.choice(layouts[rng.choice(rooms_for[family])])
        combos = usable.get((layout.layout_id, family))
        if not combos:
            failures += 1
            if failures > 10_000:
                raise ValueError(f"no {'unseen' if unseen else 'seen'} combination fits family {family!r}")
            continue
        failures = 0
        yield generate_task(layout, rng.choice(combos), rng)


def generate_split(split: str, size: int, config: SplitConfig) -> list[TaskSpec]:
    """The first `size` tasks of `split` (prefix-stable: a larger size only appends)."""
    seen_layouts, unseen_layouts = layout_pools(config)
    if split == "heldout_unseen":
        stream = _candidates("unseen", unseen_layouts, True, config)
        keep = None
    elif split in ("train", "heldout_seen"):
        stream = _candidates("seen", seen_layouts, False, config)
        keep = split == "heldout_seen"
    else:
        raise ValueError(f"unknown split {split!r}")
    specs: list[TaskSpec] = []
    signatures: set[tuple] = set()
    while len(specs) < size:
        spec = next(stream)
        signature = spec.signature
        if keep is not None and (stable_fraction("heldout", config.seed, signature) < config.heldout_seen_share) != keep:
            continue
        if signature not in signatures:
            signatures.add(signature)
            specs.append(spec)
    return specs


def features(spec: TaskSpec, expert_plan: list[str] | None = None, *, max_steps: int = 30) -> dict[str, float]:
    """Numeric difficulty features of a task (what allocators may condition on); `max_steps` as the expert's."""
    commands = plan(spec, max_steps=max_steps) if expert_plan is None else expert_plan
    layout = spec.layout
    openable = [RECEPTACLE_KINDS[kind].openable for kind in layout.kinds]
    goal_names = {name for name, _ in goal_instances(spec, max_steps=max_steps)}
    goal_kind_count = sum(1 for name, _ in spec.objects if name.split(" ", 1)[0] == spec.goal_kind)
    return {
        "family_index": float(FAMILIES.index(spec.family)),
        "room_index": float(ROOM_ORDER.index(layout.room)),
        "receptacles": float(len(layout.kinds)),
        "closed_receptacles": float(sum(openable)),
        "closed_on_path": float(sum(1 for command in commands if command.startswith("open "))),
        "objects": float(len(spec.objects)),
        "distractors": float(len(spec.objects) - goal_kind_count),
        "goal_instances": float(goal_kind_count),
        "goal_hidden": float(sum(1 for name, rec in spec.objects if name in goal_names and openable[rec])),
        "target_closed": float(spec.target >= 0 and openable[spec.target]),
        "expert_steps": float(len(commands)),
    }
