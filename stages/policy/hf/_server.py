"""`HfPolicy`: a Hugging Face causal LM that chooses among the admissible commands, served in-process.

Every `act()` builds its chat prompt (`stages/policy/vllm/_prompt.py:ChatPrompt`) and the token ids of
each admissible command (its text, then end-of-sequence) on the Trio thread. `serve()` batches requests
as the torch policy does (the first queued one, then whatever arrives within `max_wait_ms`, up to
`max_batch`) and scores them in a worker thread (`trio.to_thread.run_sync`, one at a time, torch limited
to `threads` intra-op threads): each distinct (prompt, commands) row once (`_scoring.choice_scores`),
then one command per request is drawn from softmax(score / T) over the command nucleus (top-p), by
inverting its CDF at the request's own uniform (`request_uniforms(seed, number)`), so a request's choice
does not depend on which requests share its batch. Greedy requests take the best-scoring command.

The result records the chosen command's tokens with their next-token factors as log-probs, every
command's tokens as `choices` and the command-nucleus size per token as `nucleus`: what the learner
(`_learner.ChoiceTrainable`) needs to rescore the same distribution. A context without admissible
commands gets `empty_output_action` and no tokens (nothing to train on).

Cancellation: a caller cancelled while queued or while its batch is scored stops waiting; its request is
skipped if its batch has not started and its result discarded if it has. When `serve()` exits, requests
still queued or in flight fail with `PolicyStopped`.

Versions: `load_weights(version, state)` validates and snapshots the weights (a full state, or with LoRA
an adapter state, merged from the base weights kept at start: `_merge.py`) and the worker applies the
newest snapshot right before its next batch; every `ActResult` carries the version that scored it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch
import trio

from pipeline.profiling import Profiler
from stages.policy.base import ActResult, AgentContext, Policy, PolicyStatistics, PolicyStopped
from stages.policy.batching import serve_batches
from stages.policy.sampling import nucleus_sizes
from stages.policy.torch_tiny._generate import choose_tokens
from stages.policy.torch_tiny._server import request_uniforms
from stages.policy.vllm._lora import LoraSettings, check_adapter_state
from stages.policy.vllm._prompt import ChatPrompt

from ._learner import ChoiceTrainable
from ._merge import merged_weights
from ._scoring import choice_logprobs, choice_scores

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class HfSampling:
    temperature: float = 0.7
    top_p: float = 0.95
    max_batch: int = 64
    max_wait_ms: float = 2.0
    threads: int = 1
    """torch intra-op threads in the scoring worker thread."""
    empty_output_action: str = ""
    """The action of a context without admissible commands."""


@dataclass(frozen=True, slots=True)
class HfStatistics(PolicyStatistics):
    """The run's `PolicyStatistics` (`requests`: `act()` calls taken; `answered`: requests scored; `abandoned`:
    requests whose caller stopped waiting before their batch started, never scored; `generated_tokens`: tokens
    of the chosen commands), plus what scoring the commands cost."""

    rows_scored: int = 0
    """Distinct (prompt, commands) rows scored: a row repeated within a batch is scored once."""
    commands_scored: int = 0
    prompt_tokens: int = 0
    """Prompt tokens prefilled (distinct rows)."""
    command_tokens: int = 0
    """Command tokens scored on the repeated prompt caches (distinct rows)."""


@dataclass(eq=False, slots=True)
class _Request:
    prompt: list[int]
    actions: list[str]
    """The distinct admissible commands, in the context's order."""
    commands: list[list[int]]
    """Their token ids (text, then end-of-sequence): the request's `choices`."""
    greedy: bool
    number: int
    done: trio.Event = field(default_factory=trio.Event)
    waiting: bool = True
    result: ActResult | None = None


def command_choices(prompt: ChatPrompt, admissible: Sequence[str]) -> tuple[list[str], list[list[int]]]:
    """The admissible commands a request chooses among, each once (by its token ids), with their ids."""
    actions: list[str] = []
    commands: dict[tuple[int, ...], None] = {}
    for action in admissible:
        ids = tuple(prompt.completion(action))
        if ids and ids not in commands:
            commands[ids] = None
            actions.append(action)
    return actions, [list(c) for c in commands]


class HfPolicy(Policy):
    """Implements `stages.policy.base.Policy` for a `transformers` causal LM (built by
    `stages.policy.hf.hf_backend`; hooks: `attach_profiler`, `statistics`)."""

    def __init__(
        self, lm: Any, prompt: ChatPrompt, sampling: HfSampling, *, model_path: str, seed: int, lora: LoraSettings | None = None
    ) -> None:
        self.version = 0
        self.profiler = Profiler(enabled=False)
        self.prompt = prompt
        self.sampling = sampling
        self.model_path = model_path
        self.lora = lora
        self._seed = seed
        self._lm = lm.eval().requires_grad_(False)
        self._shapes = {k: tuple(v.shape) for k, v in self._lm.state_dict().items()}
        self._base = _lora_base(self._lm, lora) if lora is not None else {}
        """With LoRA: the base weights of the adapted modules, which every version is merged from."""
        self._state: dict[str, torch.Tensor] | None = None  # the latest published weights (for trainable())
        self._model_lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._requests = 0
        self._send: trio.MemorySendChannel[_Request] | None = None
        self._stats = {"batches": 0, "requests": 0, "dropped": 0, "rows_scored": 0, "commands_scored": 0,
                       "prompt_tokens": 0, "command_tokens": 0, "generated_tokens": 0}

    @property
    def model(self) -> Any:
        """The serving model (read-only use; swap weights with `load_weights`)."""
        return self._lm

    # ----------------------------------------------------------------------------------------------
    # Policy protocol

    async def act(self, context: AgentContext, *, greedy: bool = False, number: int | None = None) -> ActResult:
        await trio.lowlevel.checkpoint_if_cancelled()
        send = self._send
        if send is None:
            raise PolicyStopped("HfPolicy.serve() is not running")
        actions, commands = command_choices(self.prompt, context.admissible)
        request = _Request(self.prompt.build(context), actions, commands, greedy, self._requests if number is None else number)
        self._requests += 1
        try:
            await send.send(request)
            await request.done.wait()
        except (trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            raise PolicyStopped("HfPolicy.serve() stopped") from exc
        finally:
            request.waiting = False
        if request.result is None:
            raise PolicyStopped("HfPolicy.serve() stopped before answering")
        return request.result

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._send is not None:
            raise RuntimeError("HfPolicy.serve() is already running")
        send, recv = trio.open_memory_channel[_Request](self.sampling.max_batch)
        limiter = trio.CapacityLimiter(1)

        async def run_batch(live: list[_Request], abandoned: int) -> None:
            self._stats["dropped"] += abandoned
            if not live:
                return
            results = await trio.to_thread.run_sync(self._score_in_worker, live, limiter=limiter)
            for request, result in zip(live, results, strict=True):
                if request.waiting:
                    request.result = result
                    request.done.set()

        self._send = send
        try:
            await serve_batches(send, recv, run_batch, max_batch=self.sampling.max_batch,
                                max_wait_ms=self.sampling.max_wait_ms, task_status=task_status)
        finally:
            self._send = None

    def load_weights(self, version: int, state: Mapping[str, Any]) -> None:
        if self.lora is not None:
            check_adapter_state(state, version)
        else:
            shapes = {k: tuple(v.shape) for k, v in state.items()}
            if shapes != self._shapes:
                missing = sorted(set(self._shapes) - set(shapes))[:5]
                unexpected = sorted(set(shapes) - set(self._shapes))[:5]
                raise ValueError(f"weights for version {version} do not fit {self.model_path} "
                                 f"(missing {missing}, unexpected {unexpected}, or shapes differ)")
        snapshot = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        self._state = snapshot
        with self._pending_lock:
            self._pending = (version, snapshot)

    def trainable(self) -> ChoiceTrainable:
        """A fresh trainable copy of the served model from its directory, with the latest published
        weights (with LoRA: a peft model whose adapter holds them)."""
        return ChoiceTrainable.load(self.model_path, temperature=self.sampling.temperature, top_p=self.sampling.top_p,
                                    state=self._state, lora=self.lora)

    def attach_profiler(self, profiler: Profiler) -> None:
        """Record this server's batches (its worker thread's CPU included) as the `policy` stage."""
        self.profiler = profiler

    def statistics(self) -> HfStatistics:
        stats = self._stats
        return HfStatistics(
            requests=self._requests, answered=stats["requests"], abandoned=stats["dropped"],
            generated_tokens=stats["generated_tokens"], version=self.version, batches=stats["batches"],
            rows_scored=stats["rows_scored"], commands_scored=stats["commands_scored"],
            prompt_tokens=stats["prompt_tokens"], command_tokens=stats["command_tokens"],
        )

    # ----------------------------------------------------------------------------------------------

    def _score_in_worker(self, batch: Sequence[_Request]) -> list[ActResult]:
        """Runs in the worker thread: apply queued weights, then score and choose for one batch."""
        s = self.sampling
        if torch.get_num_threads() != s.threads:
            torch.set_num_threads(s.threads)
        rows = [r for r in batch if r.commands]
        with self.profiler.bind_thread("policy"), self._model_lock:
            self._apply_pending()
            version = self.version
            with self.profiler.span("policy", "generate"), torch.inference_mode():
                drawn = self._choose(rows) if rows else []
            self.profiler.items("policy", len(batch))
        by_request = dict(zip(map(id, rows), drawn, strict=True))
        results = []
        for request in batch:
            choice = by_request.get(id(request))
            if choice is None:  # nothing admissible: nothing chosen, nothing to train on
                results.append(ActResult(s.empty_output_action, "", request.prompt, [], [], version))
                continue
            j, logprobs, size = choice
            command = request.commands[j]
            results.append(ActResult(
                action=request.actions[j], text=request.actions[j], prompt_ids=request.prompt, token_ids=command,
                logprobs=logprobs, policy_version=version, choices=request.commands, nucleus=[size] * len(command) if size else [],
            ))
        self._stats["batches"] += 1
        self._stats["requests"] += len(batch)
        self._stats["generated_tokens"] += sum(len(r.token_ids) for r in results)
        return results

    def _choose(self, rows: Sequence[_Request]) -> list[tuple[int, list[float], int]]:
        """(command index, its token log-probs, its command-nucleus size or 0 when none) for each row."""
        s = self.sampling
        prompts, choices = [r.prompt for r in rows], [r.commands for r in rows]
        scores = choice_scores(self._lm, prompts, choices).cpu()  # [n, K]
        distinct = {(tuple(p), tuple(map(tuple, c))): (len(p), sum(map(len, c)), len(c)) for p, c in zip(prompts, choices, strict=True)}
        self._stats["rows_scored"] += len(distinct)
        self._stats["prompt_tokens"] += sum(p for p, _, _ in distinct.values())
        self._stats["command_tokens"] += sum(t for _, t, _ in distinct.values())
        self._stats["commands_scored"] += sum(k for _, _, k in distinct.values())
        sizes = nucleus_sizes(scores.double(), temperature=s.temperature, top_p=s.top_p)  # [n]
        uniforms = torch.stack([request_uniforms(self._seed, r.number, 1)[0] for r in rows])  # [n]
        greedy = torch.tensor([r.greedy for r in rows])  # [n]
        picked = choose_tokens(scores, uniforms, greedy, temperature=s.temperature, top_p=s.top_p, nucleus=sizes)  # [n]
        logp, _ = choice_logprobs(scores, choices, picked, temperature=s.temperature, top_p=s.top_p, nucleus=sizes)  # [n, W]
        recorded = s.temperature > 0 and s.top_p < 1.0
        return [
            (int(j), logp[i, : len(choices[i][int(j)])].tolist(), int(sizes[i]) if recorded else 0)
            for i, j in enumerate(picked.tolist())
        ]

    def _apply_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        version, state = pending
        with self.profiler.span("policy", "weight_load"):
            if self.lora is not None:
                merged = merged_weights(self._base, state, scale=self.lora.alpha / self.lora.rank)
                self._lm.load_state_dict(merged, strict=False)
            else:
                self._lm.load_state_dict(state)
        self.version = version
        log.info("policy.weights_loaded", version=version)


def _lora_base(lm: Any, lora: LoraSettings) -> dict[str, torch.Tensor]:
    """Copies of the weights of every module a LoRA on `lora.target_modules` adapts (peft's rule: the
    module name's last part is a target)."""
    targets = set(lora.target_modules)
    return {
        name: w.detach().clone() for name, w in lm.state_dict().items()
        if name.endswith(".weight") and name.removesuffix(".weight").rsplit(".", 1)[-1] in targets
    }
