"""Prompt building (context -> token ids) and action parsing (generated text -> action string).

Prompt layout, one line per piece for reading (the model sees section markers, not newlines):

    <bos> <task> put a clean mug in cabinet 1
    [<obs> {the episode's first observation}]               only with pin_first, once it left the window
    [<act> {earlier action} <act> {earlier action} ...]     only with memory
    <obs> {observation t-2, first `max_obs_tokens` words} <act> {action t-2}
    <obs> {observation t-1} <act> {action t-1}
    <obs> {observation t}
    [<cmds> {command} <sep> {command} ...]          only with show_admissible
    <act>

and the completion is `{action} <eos>`. Behaviour cloning trains on exactly these prompts, so what the
model sees at act time is what it was trained on. When a prompt would exceed `max_prompt_tokens`, the
oldest history pairs go first, then trailing admissible commands, then the current observation's tail.

`memory`: the turns before the shown pairs keep their action only, each distinct action once (its first
time), so a long episode still shows where the agent has been and what it opened or took. Without it a
turn that leaves the history window is forgotten, and an agent searching a room cannot tell which
receptacles it has already looked into. `pin_first` keeps the first observation too (in the household
env, the room's listing: every receptacle there is to search). When the prompt is over budget, the
history pairs beyond the most recent `memory_keeps_pairs` go first, then memory entries (oldest first),
then the pinned observation, then the remaining pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rapidfuzz import fuzz, process, utils

from stages.policy.base import AgentContext

from ._tokenizer import WordTokenizer


@dataclass(frozen=True, slots=True)
class PromptFormat:
    tokenizer: WordTokenizer
    history: int = 2
    """Earlier (observation, action) pairs shown, most recent last."""
    show_admissible: bool = False
    max_obs_tokens: int = 40
    """Words kept from each observation (its beginning)."""
    max_prompt_tokens: int = 200
    memory: bool = False
    """Show the actions of turns before the history pairs, each distinct action once (see the module doc)."""
    memory_keeps_pairs: int = 2
    """With memory, the most recent history pairs that outrank memory entries when the budget is short."""
    pin_first: bool = False
    """Keep the episode's first observation (a room's listing) once its turn has left the history window."""
    pin_tokens: int = 0
    """Words kept from the pinned first observation (0 = `max_obs_tokens`): a room's listing runs to ~125
    words in the household env (77 on average), past the per-observation cut."""

    def build(self, ctx: AgentContext) -> list[int]:
        tok = self.tokenizer
        head = [tok.bos_id, tok.task_id, *tok.encode(ctx.task)]
        obs = [tok.obs_id, *self._observation(ctx.observation)]
        shown = ctx.history[-self.history :] if self.history > 0 else ()
        pairs = [[tok.obs_id, *self._observation(o), tok.act_id, *tok.encode(a)] for o, a in shown]
        cmds = [[tok.sep_id, *tok.encode(c)] for c in ctx.admissible] if self.show_admissible else []
        if cmds:
            cmds[0][0] = tok.cmds_id
        tail = [tok.act_id]
        earlier = ctx.history[: len(ctx.history) - len(shown)] if self.memory else ()
        memory = [[tok.act_id, *tok.encode(a)] for a in dict.fromkeys(a for _, a in earlier)]
        left_window = len(ctx.history) > len(shown)
        pinned = (
            [tok.obs_id, *tok.encode(ctx.history[0][0])[: self.pin_tokens or self.max_obs_tokens]]
            if self.pin_first and left_window else []
        )

        def size() -> int:
            return (len(head) + len(pinned) + sum(map(len, memory)) + sum(map(len, pairs)) + len(obs)
                    + sum(map(len, cmds)) + len(tail))

        while len(pairs) > self.memory_keeps_pairs and (memory or pinned) and size() > self.max_prompt_tokens:
            pairs.pop(0)
        while memory and size() > self.max_prompt_tokens:
            memory.pop(0)
        if pinned and size() > self.max_prompt_tokens:
            pinned = []
        while pairs and size() > self.max_prompt_tokens:
            pairs.pop(0)
        while cmds and size() > self.max_prompt_tokens:
            cmds.pop()
        excess = size() - self.max_prompt_tokens
        if excess > 0:
            obs = obs[: max(1, len(obs) - excess)]
        ids = [*head, *pinned, *(t for m in memory for t in m), *(t for p in pairs for t in p), *obs,
               *(t for c in cmds for t in c), *tail]
        if len(ids) > self.max_prompt_tokens:  # only a task text longer than the budget gets here
            ids = [*ids[: self.max_prompt_tokens - 1], *tail]
        return ids

    def completion(self, action: str) -> list[int]:
        """Target ids of an action: its words then `<eos>`."""
        return [*self.tokenizer.encode(action), self.tokenizer.eos_id]

    def choices(self, admissible: Sequence[str], max_tokens: int) -> list[list[int]]:
        """The completions decoding may be constrained to (`stages.policy.choices`): each admissible
        command that fits `max_tokens` and has no unknown word. Empty (unconstrained) when none does."""
        out = [self.completion(c) for c in admissible]
        return [c for c in out if len(c) <= max_tokens and self.tokenizer.unk_id not in c]

    def _observation(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)[: self.max_obs_tokens]


def parse_action(text: str, admissible: Sequence[str], *, fuzzy_cutoff: float = 75.0, empty_action: str = "") -> str:
    """Map generated text to the action the environment receives.

    Exact match among `admissible` -> the closest admissible command by normalised Levenshtein
    similarity (`rapidfuzz.fuzz.ratio` on lower-cased, punctuation-stripped text) scoring at least
    `fuzzy_cutoff` (0-100) -> the raw first line, stripped (an invalid command the env treats as a no-op).
    An output that is empty after stripping becomes `empty_action` (the Selective Rollout reference: "look").
    """
    raw = text.strip().split("\n", 1)[0].strip()
    if not raw:
        return empty_action
    if raw in admissible:
        return raw
    if admissible and raw:
        match = process.extractOne(
            raw, admissible, scorer=fuzz.ratio, processor=utils.default_process, score_cutoff=fuzzy_cutoff
        )
        if match is not None:
            return match[0]
    return raw
