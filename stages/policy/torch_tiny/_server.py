"""The torch-tiny `Policy`: batches concurrent `act()` calls and decodes them in a worker thread.

Batching: `serve()` takes the first queued request, then gathers more until `max_batch` or `max_wait_ms`
after the first, and decodes the batch with `trio.to_thread.run_sync` (one worker at a time, torch
limited to `threads` intra-op threads there) so the Trio loop stays responsive.

Cancellation: a caller cancelled while queued or while its batch decodes simply stops waiting; the
request is marked abandoned, skipped if its batch has not started, and its result is discarded if it
has. Other requests of the batch are unaffected. When `serve()` exits, requests still queued or in
flight fail with `PolicyStopped`.

Versions: `load_weights(version, state)` snapshots and validates the weights at once and the worker
applies the latest snapshot right before its next batch; every `ActResult` carries the version that
generated it, and `self.version` is the version loaded now (0 = the initial / warm-start weights).

Reproducibility: request number n (counted when `act()` is entered, so in call order) samples from a
generator seeded by `(seed, n)`: tokens come from that request's own uniforms, not from a shared stream,
so which requests share a batch does not change any result (see `_generate.py`).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch
import trio

from pipeline.devices import new_stream, side_stream
from pipeline.profiling import Profiler
from stages.policy.base import ActResult, AgentContext, Policy, PolicyStatistics, PolicyStopped
from stages.policy.batching import serve_batches

from ._generate import generate
from ._model import TinyLM
from ._prompt import PromptFormat, parse_action

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 12
    max_batch: int = 64
    max_wait_ms: float = 2.0
    threads: int = 1
    """torch intra-op threads in the decoding worker thread."""
    fuzzy_cutoff: float = 75.0
    empty_output_action: str = ""
    """The action sent for an empty output (the reference: "look")."""
    choose_admissible: bool = False
    """Decode only admissible commands (`stages.policy.choices`); the choices travel with each result."""

    def choices(self, prompt: PromptFormat, admissible: Sequence[str]) -> list[list[int]]:
        """What a request's decoding is constrained to ([] = free)."""
        return prompt.choices(admissible, self.max_new_tokens) if self.choose_admissible else []


@dataclass(eq=False, slots=True)
class _Request:
    prompt: list[int]
    admissible: tuple[str, ...]
    greedy: bool
    number: int
    done: trio.Event = field(default_factory=trio.Event)
    waiting: bool = True
    """False once the caller stopped waiting (answered or cancelled)."""
    result: ActResult | None = None


def request_seed(seed: int, number: int) -> int:
    """A well-mixed 63-bit seed for request `number` of a policy seeded with `seed` (splitmix64)."""
    z = (seed * 0x9E3779B97F4A7C15 + number + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) >> 1


def request_uniforms(seed: int, number: int, n: int) -> torch.Tensor:
    """The n uniforms [n] that request `number` samples its tokens with."""
    return torch.rand(n, generator=torch.Generator().manual_seed(request_seed(seed, number)))


class TorchTinyPolicy(Policy):
    """Implements `stages.policy.base.Policy` for a `TinyLM` (hook: `attach_profiler`)."""

    def __init__(self, model: TinyLM, prompt: PromptFormat, sampling: SamplingConfig, *, seed: int) -> None:
        self.version = 0
        self.profiler = Profiler(enabled=False)
        """Replaced by the runtime's profiler (see `attach_profiler`): spans for generate / weight_load."""
        self.prompt = prompt
        self.sampling = sampling
        self._seed = seed
        self._model = model.eval().requires_grad_(False)
        self._device = model.tok_emb.weight.device
        self._stream = new_stream(self._device)
        """On CUDA the decoding runs on a stream of its own, so its CUDA events time decoding alone."""
        self._shapes = {k: tuple(v.shape) for k, v in self._model.state_dict().items()}
        self._model_lock = threading.Lock()  # the worker decodes / swaps weights; trainable() copies
        self._pending_lock = threading.Lock()  # guards _pending only, never held across a batch
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._requests = 0
        self._send: trio.MemorySendChannel[_Request] | None = None
        self._stats = {"batches": 0, "answered": 0, "abandoned": 0, "generated_tokens": 0}

    @property
    def model(self) -> TinyLM:
        """The serving model (read-only use; swap weights with `load_weights`)."""
        return self._model

    # ----------------------------------------------------------------------------------------------
    # Policy protocol

    async def act(self, context: AgentContext, *, greedy: bool = False, number: int | None = None) -> ActResult:
        """Decode one action; `number` (default: the next in call order) picks the request's random stream,
        so a worker process answering for a pool samples exactly what this process would have."""
        # A caller whose scope is already cancelled (e.g. during shutdown, after serve() stopped) gets
        # Cancelled, not PolicyStopped: it is being torn down, not failing.
        await trio.lowlevel.checkpoint_if_cancelled()
        send = self._send
        if send is None:
            raise PolicyStopped("TorchTinyPolicy.serve() is not running")
        request = _Request(self.prompt.build(context), context.admissible, greedy, self._requests if number is None else number)
        self._requests += 1
        waited = False
        try:
            await send.send(request)
            await request.done.wait()
            waited = True
        except (trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            waited = True
            raise PolicyStopped("TorchTinyPolicy.serve() stopped") from exc
        finally:
            request.waiting = False  # a cancelled caller abandons the request
            if not waited:
                self._stats["abandoned"] += 1
        if request.result is None:
            raise PolicyStopped("TorchTinyPolicy.serve() stopped before answering")
        self._stats["answered"] += 1
        return request.result

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._send is not None:
            raise RuntimeError("TorchTinyPolicy.serve() is already running")
        send, recv = trio.open_memory_channel[_Request](self.sampling.max_batch)
        limiter = trio.CapacityLimiter(1)

        async def run_batch(live: list[_Request], abandoned: int) -> None:
            if live:
                await self._decode(live, limiter)

        self._send = send
        try:
            await serve_batches(send, recv, run_batch, max_batch=self.sampling.max_batch,
                                max_wait_ms=self.sampling.max_wait_ms, task_status=task_status)
        finally:
            self._send = None

    def load_weights(self, version: int, state: Mapping[str, Any]) -> None:
        shapes = {k: tuple(v.shape) for k, v in state.items()}
        if shapes != self._shapes:
            missing = sorted(set(self._shapes) - set(shapes))
            unexpected = sorted(set(shapes) - set(self._shapes))
            raise ValueError(
                f"weights for version {version} do not fit the model "
                f"(missing {missing}, unexpected {unexpected}, or shapes differ)"
            )
        snapshot = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        with self._pending_lock:
            self._pending = (version, snapshot)

    def attach_profiler(self, profiler: Profiler) -> None:
        """Record this server's batches (its worker thread's CPU included) as the `policy` stage."""
        self.profiler = profiler

    def trainable(self) -> TinyLM:
        """A deep copy of the serving model with gradients on (waits for a running batch to finish)."""
        with self._model_lock:
            clone = copy.deepcopy(self._model)
        return clone.requires_grad_(True).train()

    def statistics(self) -> PolicyStatistics:
        return PolicyStatistics(requests=self._requests, **self._stats, version=self.version)

    # ----------------------------------------------------------------------------------------------
    # Batching

    async def _decode(self, batch: list[_Request], limiter: trio.CapacityLimiter) -> None:
        jobs = [(r.prompt, r.admissible, r.greedy, r.number) for r in batch]
        results = await trio.to_thread.run_sync(self._decode_in_worker, jobs, limiter=limiter)
        self._stats["batches"] += 1
        self._stats["generated_tokens"] += sum(len(r.token_ids) for r in results)
        for request, result in zip(batch, results, strict=True):
            if request.waiting:
                request.result = result
                request.done.set()

    def _decode_in_worker(
        self, jobs: Sequence[tuple[list[int], tuple[str, ...], bool, int]]
    ) -> list[ActResult]:
        """Runs in the worker thread: apply queued weights, then decode one batch."""
        s = self.sampling
        if torch.get_num_threads() != s.threads:
            torch.set_num_threads(s.threads)
        uniforms = torch.stack([self._uniforms(number, greedy) for _, _, greedy, number in jobs])  # [B, N]
        tok = self.prompt.tokenizer
        choices = [s.choices(self.prompt, admissible) for _, admissible, _, _ in jobs]
        with self.profiler.bind_thread("policy"), self._model_lock, side_stream(self._device, self._stream):
            self._apply_pending()
            version = self.version
            with self._generate_span():
                samples = generate(
                    self._model,
                    [prompt for prompt, *_ in jobs],
                    uniforms=uniforms,
                    greedy=[greedy for _, _, greedy, _ in jobs],
                    max_new_tokens=s.max_new_tokens,
                    temperature=s.temperature,
                    top_p=s.top_p,
                    stop_ids=(tok.eos_id, tok.nl_id),
                    choices=choices if s.choose_admissible else None,
                )
            self.profiler.items("policy", len(jobs))
        results = []
        for (prompt, admissible, _, _), sample, options in zip(jobs, samples, choices, strict=True):
            text = tok.decode(sample.token_ids)
            results.append(
                ActResult(
                    action=parse_action(text, admissible, fuzzy_cutoff=s.fuzzy_cutoff, empty_action=s.empty_output_action),
                    text=text,
                    prompt_ids=prompt,
                    token_ids=sample.token_ids,
                    logprobs=sample.logprobs,
                    policy_version=version,
                    choices=options,
                    nucleus=sample.nucleus,
                    entropy=sample.entropy,
                )
            )
        return results

    def _generate_span(self) -> Any:
        """The `policy` busy span of a batch; on CUDA also timed by CUDA events (the profile's exact GPU time)."""
        if self._device.type == "cuda":
            return self.profiler.cuda_span("policy", "generate")
        return self.profiler.span("policy", "generate")

    def _uniforms(self, number: int, greedy: bool) -> torch.Tensor:
        if greedy:
            return torch.zeros(self.sampling.max_new_tokens)
        return request_uniforms(self._seed, number, self.sampling.max_new_tokens)

    def _apply_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            version, state = pending
            with self.profiler.span("policy", "weight_load"):
                self._model.load_state_dict(state)
            self.version = version
            log.info("policy.weights_loaded", version=version)
