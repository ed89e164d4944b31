"""Prompts for a Hugging Face tokenizer: the chat template when the tokenizer has one, else plain text.

Messages (chat template):

    system     [{instruction}\n]{task}
    user       {observation t-k}        up to `history` earlier (observation, action) pairs,
    assistant  {action t-k}             oldest first
    ...
    user       {observation t}[\\nAdmissible commands: a; b; ...]   (only with show_admissible)
    -> add_generation_prompt

Without a chat template the same pieces are written as `Task: ...\\nObservation: ...\\nAction: ...` lines
ending with `Action:` (the instruction, when set, as a first line). `instruction` is for a pretrained chat
model that needs telling what to answer (e.g. "reply with one admissible command"); empty by default.
Observations keep their first `max_obs_words` words. When a prompt is longer than `max_prompt_tokens`, the
oldest history pairs go first, then the current observation is cut word by word.

`completion(action)` is the action's ids plus the end-of-sequence id: what behaviour cloning trains on
and what a generation that stops at `eos` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stages.policy.base import AgentContext


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    tokenizer: Any
    """A `transformers` tokenizer (`PreTrainedTokenizerBase`)."""
    history: int = 8
    show_admissible: bool = False
    max_obs_words: int = 64
    max_prompt_tokens: int = 200
    instruction: str = ""

    @property
    def has_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def build(self, ctx: AgentContext) -> list[int]:
        """Prompt ids for `ctx`, at most `max_prompt_tokens` long (unless the task text alone is longer)."""
        shown = list(ctx.history[-self.history :]) if self.history > 0 else []
        words = ctx.observation.split()[: self.max_obs_words]
        ids = self._encode(ctx, shown, words)
        while shown and len(ids) > self.max_prompt_tokens:
            shown.pop(0)
            ids = self._encode(ctx, shown, words)
        while len(words) > 1 and len(ids) > self.max_prompt_tokens:
            words = words[: max(1, len(words) - (len(ids) - self.max_prompt_tokens))]
            ids = self._encode(ctx, shown, words)
        return ids

    def completion(self, action: str) -> list[int]:
        eos = self.tokenizer.eos_token_id
        return [*self.tokenizer.encode(action, add_special_tokens=False), *([eos] if eos is not None else [])]

    def stop_token_ids(self) -> list[int]:
        """eos, plus a newline when it is a single token (an action is one line)."""
        stops = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        newline = self.tokenizer.encode("\n", add_special_tokens=False)
        if len(newline) == 1 and newline[0] not in stops:
            stops.append(newline[0])
        return stops

    def _encode(self, ctx: AgentContext, shown: list[tuple[str, str]], words: list[str]) -> list[int]:
        observation = " ".join(words)
        if self.show_admissible and ctx.admissible:
            observation += "\nAdmissible commands: " + "; ".join(ctx.admissible)
        if self.has_template:
            system = f"{self.instruction}\n{ctx.task}" if self.instruction else ctx.task
            messages = [{"role": "system", "content": system}]
            for obs, action in shown:
                messages.append({"role": "user", "content": self._cut(obs)})
                messages.append({"role": "assistant", "content": action})
            messages.append({"role": "user", "content": observation})
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return self._tokenize(text)
        lines = [*([self.instruction] if self.instruction else []), f"Task: {ctx.task}"]
        for obs, action in shown:
            lines += [f"Observation: {self._cut(obs)}", f"Action: {action}"]
        lines += [f"Observation: {observation}", "Action:"]
        return list(self.tokenizer.encode("\n".join(lines), add_special_tokens=True))

    def _tokenize(self, text: str) -> list[int]:
        """Ids of a rendered chat prompt, as `apply_chat_template(tokenize=True)` gives them (no special
        tokens added), straight from the Rust backend when there is one: rendering and encoding apart skip
        the tokenizer's Python wrapping, about a third of a prompt's cost on the word-level make-model
        tokenizer (measured; a prompt is built for every request)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _cut(self, text: str) -> str:
        return " ".join(text.split()[: self.max_obs_words])
