"""A fake AsyncLLM (the API surface VllmPolicy uses) and a word tokenizer, for tests without vLLM."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


class WordTok:
    """Word ids by position in a growing list; no chat template (the plain prompt path)."""

    eos_token_id = 1
    chat_template = None

    def __init__(self) -> None:
        self.words: list[str] = ["<pad>", "<eos>"]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = []
        for word in text.split():
            if word not in self.words:
                self.words.append(word)
            ids.append(self.words.index(word))
        return ids


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Completion:
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, _Logprob]]


@dataclass
class _Output:
    outputs: list[_Completion]


@dataclass
class FakeEngine:
    """`generate` answers "look" at once, or blocks until cancelled when `block` is set."""

    block: bool = False
    fail_rpc: bool = False
    hold_rpc: asyncio.Event | None = None
    params: list[Any] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    rpcs: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    shut_down: bool = False
    abort_seen: asyncio.Event | None = None
    on_running: Any = None
    """Called on the loop thread once a request is in the engine (tests wake a Trio event with it)."""
    loras: list[Any] = field(default_factory=list)
    """Adapters registered with add_lora, in order."""
    request_loras: list[Any] = field(default_factory=list)
    """The lora_request of every generate call."""
    request_ids: list[str] = field(default_factory=list)
    """The request_id of every generate call."""

    async def generate(
        self, prompt: dict[str, list[int]], params: Any, request_id: str, lora_request: Any = None
    ) -> Any:
        self.params.append(params)
        self.request_loras.append(lora_request)
        self.request_ids.append(request_id)
        self.running.add(request_id)
        if self.on_running is not None:
            self.on_running()
        try:
            if self.block:
                await asyncio.Event().wait()
            yield _Output([_Completion("look", [7, 1], [{7: _Logprob(-0.5)}, {1: _Logprob(-0.25)}])])
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)  # where AsyncLLM calls abort(request_id)
            if self.abort_seen is not None:
                self.abort_seen.set()
            raise
        finally:
            self.running.discard(request_id)

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[Any, ...] = ()) -> Any:  # noqa: ASYNC109 (AsyncLLM's signature)
        if self.hold_rpc is not None:
            await self.hold_rpc.wait()
        if self.fail_rpc:
            raise RuntimeError("worker refused the weights")
        self.rpcs.append((method, args))
        return [args[0]]

    async def add_lora(self, lora_request: Any) -> bool:
        if self.fail_rpc:
            raise RuntimeError("engine refused the adapter")
        self.loras.append(lora_request)
        return True

    def shutdown(self) -> None:
        self.shut_down = True


def fake_params(sampling: Any, *, greedy: bool, seed: int | None, stop_token_ids: list[int]) -> dict[str, Any]:
    return {"greedy": greedy, "seed": seed, "stop": stop_token_ids, "temperature": sampling.temperature}
