"""The built-in household environment: ALFWorld-like rooms, receptacles, objects and six task families.

Pure Python, deterministic by seed, fast (tens of thousands of steps per second with admissible
commands). Modules, by concept:

- `catalog`  room, receptacle and object kinds; the task families and their texts
- `world`    layout and task generation (`Layout`, `TaskSpec`)
- `grammar`  the command grammar (`parse_command`)
- `engine`   the episode rules, observations and admissible commands (`HouseholdEnv`)
- `expert`   the searching planner (`plan`; `omniscient=True` for the old one)
- `recovery` the omniscient expert's next command from any episode state (`next_command`)
- `splits`   train / heldout_seen / heldout_unseen and task features
- `text`     every message, the tokenization rule and the vocabulary
- `suite`    `HouseholdSuite`, the registered `household` suite
"""

from .engine import HouseholdEnv
from .suite import HouseholdSuite
from .text import tokenize
from .world import Layout, TaskSpec

__all__ = ["HouseholdEnv", "HouseholdSuite", "Layout", "TaskSpec", "tokenize"]
