"""`VllmPolicy`: rollcut's `Policy` served by vLLM's `AsyncLLM` on its own asyncio loop thread.

Requests: every `act()` builds its prompt ids on the Trio thread and submits one `AsyncLLM.generate` at
once (vLLM's scheduler does the batching); the result (text, token ids, processed log-probs) comes back
through the loop thread's future and wakes the Trio task through its token.

Abort on cut: a cancelled `act()` (the gate cut its group, so the rollout stage cancelled the group's
scope) cancels its asyncio task; `AsyncLLM.generate` then calls `abort(request_id)`, which drops the
request from the output processor and sends one ABORT to the engine core, which frees its KV blocks
before its next step. The time from the Trio cancellation to the end of that abort is recorded per
request (`statistics().abort_p50_s / abort_p99_s`).

Versions: `load_weights(version, state)` validates and snapshots the weights, then a coroutine on the
loop sends them to every worker (`collective_rpc("rollcut_load_weights")`, between engine steps); with
LoRA (`_lora.py`) the state is an adapter, written as a peft directory and registered with
`AsyncLLM.add_lora`, and later requests carry its `LoRARequest`. Syncs
are serialised and only the newest pending one is sent. A result carries the version the engine held
when its request was *submitted*: a request that straddles an update is stamped with the older version,
so staleness is never under-counted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch
import trio

from pipeline.profiling import Profiler
from stages.policy.base import ActResult, AgentContext, Policy, PolicyStatistics, PolicyStopped
from stages.policy.torch_tiny._prompt import parse_action
from stages.policy.torch_tiny._server import request_seed

from ._learner import CausalLMTrainable
from ._loop import LoopThread, wait_trio
from ._lora import LoraSettings, check_adapter_state, write_adapter
from ._prompt import ChatPrompt
from ._vllm_api import Sampling, engine_process_ids, lora_request, sampling_params
from ._worker import WireTensor, to_wire

log = structlog.get_logger(__name__)

KEEP_ADAPTERS = 8
"""LoRA adapter directories kept on disk: the engine may reload an evicted older one for a late request."""

ENGINE_STAGE = "vllm"
"""Profile stage of the engine: busy while any request is in flight; CPU of the engine process(es)."""


@dataclass(eq=False, slots=True)
class _Request:
    request_id: str
    number: int
    prompt: list[int]
    admissible: tuple[str, ...]
    greedy: bool
    cancelled_at: float | None = None


@dataclass(slots=True)
class _Stats:
    requests: int = 0
    completed: int = 0
    aborted: int = 0
    generated_tokens: int = 0
    abort_s: list[float] = field(default_factory=list)
    weight_sync_s: list[float] = field(default_factory=list)


def _percentiles_s(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(p50, p99) of `values` in seconds; (None, None) for none."""
    if not values:
        return None, None
    p50, p99 = np.percentile(np.asarray(values), [50, 99])
    return float(p50), float(p99)


class VllmPolicy(Policy):
    """Implements `stages.policy.base.Policy` on an `AsyncLLM` (built by `stages.policy.vllm.vllm_backend`;
    hooks: `attach_profiler`, `close`)."""

    def __init__(
        self,
        loop: LoopThread,
        engine: Any,
        prompt: ChatPrompt,
        sampling: Sampling,
        *,
        model_path: str,
        shapes: Mapping[str, tuple[int, ...]],
        seed: int,
        make_params: Callable[..., Any] | None = None,
        lora: LoraSettings | None = None,
        make_lora: Callable[[str, int, str], Any] | None = None,
    ) -> None:
        self.version = 0
        self.lora = lora
        self.profiler = Profiler(enabled=False)
        self.prompt = prompt
        self.sampling = sampling
        self.model_path = model_path
        self.engine = engine
        self._loop = loop
        self._shapes = dict(shapes)
        self._seed = seed
        self._stops = prompt.stop_token_ids()
        self._make_params = make_params or sampling_params
        self._requests = 0
        self._serving = False
        self._inflight: dict[str, Any] = {}  # request id -> concurrent future (Trio thread only)
        self._state: dict[str, torch.Tensor] | None = None  # latest published weights (for trainable())
        self._pending: tuple[int, list[WireTensor] | tuple[str, int, str]] | None = None
        """(version, full weights as wire tensors | a LoRA adapter as (name, id, directory)), newest only."""
        self._sync_lock: asyncio.Lock | None = None
        self._syncs: list[Any] = []
        self._failure: BaseException | None = None
        self._on_failure: Any = None
        self._busy = 0
        self._busy_span: Any = None
        self._stats = _Stats()
        self._closed = False
        self._lora_request: Any = None  # the adapter of self.version (None = base weights)
        self._lora_ids = 0
        self._make_lora = make_lora or lora_request
        self._adapters = tempfile.TemporaryDirectory(prefix="rollcut-lora-") if lora is not None else None

    # ----------------------------------------------------------------------------------------------
    # Policy protocol

    async def act(self, context: AgentContext, *, greedy: bool = False, number: int | None = None) -> ActResult:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._serving:
            raise PolicyStopped("VllmPolicy.serve() is not running")
        self._raise_failure()
        local = self._requests  # the engine's request id stays unique here whatever `number` a pool assigned
        self._requests += 1
        number = local if number is None else number
        request = _Request(f"rollcut-{local}", number, self.prompt.build(context), context.admissible, greedy)
        future = self._loop.submit(self._generate(request))
        self._inflight[request.request_id] = future

        def cancelled() -> None:
            request.cancelled_at = time.perf_counter()

        try:
            return await wait_trio(future, on_cancel=cancelled)
        except concurrent.futures.CancelledError as exc:  # serve() stopped and cancelled the request
            raise PolicyStopped("VllmPolicy.serve() stopped before answering") from exc
        finally:
            self._inflight.pop(request.request_id, None)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept requests until cancelled; a failed weight sync ends it with that error."""
        if self._serving:
            raise RuntimeError("VllmPolicy.serve() is already running")
        if self._closed:
            raise PolicyStopped("VllmPolicy is closed")
        failed = trio.Event()
        token = trio.lowlevel.current_trio_token()
        self._on_failure = lambda: token.run_sync_soon(failed.set)
        self._serving = True
        try:
            task_status.started()
            if self._failure is None:
                await failed.wait()
            self._raise_failure()
        finally:
            self._serving = False
            self._on_failure = None
            for future in list(self._inflight.values()):
                future.cancel()  # waiting act() calls fail with PolicyStopped; the engine aborts them

    def load_weights(self, version: int, state: Mapping[str, Any]) -> None:
        if self.lora is not None:
            check_adapter_state(state, version)
        else:
            self._check_shapes(version, state)
        snapshot = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}
        self._state = snapshot
        if self.lora is not None:
            self._pending = (version, self._write_adapter(version, snapshot))
        else:
            self._pending = (version, [to_wire(k, v) for k, v in snapshot.items() if k in self._shapes])
        self._syncs = [f for f in self._syncs if not f.done()]
        self._syncs.append(self._loop.submit(self._sync_weights()))

    def trainable(self) -> CausalLMTrainable:
        """A fresh `transformers` copy of the served weights (the latest published state, if any)."""
        return CausalLMTrainable.load(
            self.model_path,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            state=self._state,
            lora=self.lora,
        )

    def attach_profiler(self, profiler: Profiler) -> None:
        """Record the frontend loop thread as `policy` and the engine as its own `vllm` stage."""
        self.profiler = profiler
        self._loop.submit(self._bind_loop_thread(profiler)).result(30)
        for pid in engine_process_ids(self.engine):
            bind = getattr(profiler, "bind_process", None)
            if bind is not None:
                bind(ENGINE_STAGE, pid)

    def wait_synced(self, timeout: float | None = 600) -> int:
        """Block (a non-Trio thread) until every queued weight sync is applied; returns the engine's version."""
        for future in list(self._syncs):
            future.result(timeout)
        self._raise_failure()
        return self.version

    def statistics(self) -> PolicyStatistics:
        s = self._stats
        (abort_p50, abort_p99), (sync_p50, _) = _percentiles_s(s.abort_s), _percentiles_s(s.weight_sync_s)
        return PolicyStatistics(
            requests=s.requests, answered=s.completed, abandoned=s.aborted, generated_tokens=s.generated_tokens,
            version=self.version, abort_p50_s=abort_p50, abort_p99_s=abort_p99, weight_syncs=len(s.weight_sync_s),
            weight_sync_p50_s=sync_p50, weight_sync_max_s=max(s.weight_sync_s) if s.weight_sync_s else None,
        )

    def close(self) -> None:
        """Shut the engine down and stop the loop thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.engine.shutdown()
        finally:
            self._loop.close()
            self.engine = None  # AsyncLLM.__del__ now, not during interpreter teardown
            if self._adapters is not None:
                self._adapters.cleanup()
        log.info("policy.vllm.closed", **asdict(self.statistics()))

    # ----------------------------------------------------------------------------------------------
    # On the asyncio loop thread

    async def _generate(self, request: _Request) -> ActResult:
        version, lora = self.version, self._lora_request  # read together: the loop thread sets both
        self._stats.requests += 1
        started = time.perf_counter()
        self._enter_busy()
        final = None
        try:
            async for output in self.engine.generate(
                {"prompt_token_ids": request.prompt}, self._params(request), request.request_id, lora_request=lora
            ):
                final = output
        except asyncio.CancelledError:
            self._stats.aborted += 1
            if request.cancelled_at is not None:
                self._stats.abort_s.append(time.perf_counter() - request.cancelled_at)
            raise
        finally:
            self._exit_busy()
        if final is None or not final.outputs:
            raise RuntimeError(f"vLLM returned no output for {request.request_id}")
        # The engine's row: request latency for p50 / p99 (its busy span is one long union), tokens/s.
        self.profiler.latency(ENGINE_STAGE, "request", time.perf_counter() - started)
        self.profiler.items(ENGINE_STAGE, len(final.outputs[0].token_ids))
        return self._result(request, final.outputs[0], version)

    def _params(self, request: _Request) -> Any:
        seed = request_seed(self._seed, request.number) % (2**31) if self.sampling.seeded else None
        return self._make_params(self.sampling, greedy=request.greedy, seed=seed, stop_token_ids=self._stops)

    def _result(self, request: _Request, completion: Any, version: int) -> ActResult:
        token_ids = list(completion.token_ids)
        logprobs = [float(step[tok].logprob) for step, tok in zip(completion.logprobs, token_ids, strict=True)]
        text = completion.text
        self._stats.completed += 1
        self._stats.generated_tokens += len(token_ids)
        self.profiler.items("policy", 1)
        return ActResult(
            action=parse_action(text, request.admissible, fuzzy_cutoff=self.sampling.fuzzy_cutoff),
            text=text,
            prompt_ids=request.prompt,
            token_ids=token_ids,
            logprobs=logprobs,
            policy_version=version,
        )

    async def _sync_weights(self) -> None:
        if self._sync_lock is None:
            self._sync_lock = asyncio.Lock()
        async with self._sync_lock:
            pending, self._pending = self._pending, None
            if pending is None:  # a newer sync already sent these (or later) weights
                return
            version, weights = pending
            started = time.perf_counter()
            try:
                with self.profiler.span("policy", "weight_load"):
                    if isinstance(weights, tuple):  # a LoRA adapter: (name, id, directory)
                        lora = self._make_lora(*weights)
                        await self.engine.add_lora(lora)
                    else:
                        await self.engine.collective_rpc("rollcut_load_weights", args=(version, weights))
            except Exception as exc:
                self._fail(exc)
                raise
            if isinstance(weights, tuple):
                self._lora_request = lora
            self.version = version
            self._stats.weight_sync_s.append(time.perf_counter() - started)
            log.info("policy.weights_loaded", version=version, ms=round(self._stats.weight_sync_s[-1] * 1000, 1))

    async def _bind_loop_thread(self, profiler: Profiler) -> None:
        profiler.bind_thread("policy")

    def _enter_busy(self) -> None:
        self._busy += 1
        if self._busy == 1:
            self._busy_span = self.profiler.span(ENGINE_STAGE, "requests_in_flight")
            self._busy_span.__enter__()

    def _exit_busy(self) -> None:
        self._busy -= 1
        if self._busy == 0 and self._busy_span is not None:
            self._busy_span.__exit__(None, None, None)
            self._busy_span = None

    # ----------------------------------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        notify = self._on_failure
        if notify is not None:
            try:
                notify()
            except trio.RunFinishedError:
                pass

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"vLLM weight sync failed: {self._failure!r}") from self._failure

    def _write_adapter(self, version: int, state: Mapping[str, torch.Tensor]) -> tuple[str, int, str]:
        """Write version `version`'s adapter directory (the 8 newest are kept for late requests)."""
        assert self.lora is not None and self._adapters is not None
        self._lora_ids += 1
        root = Path(self._adapters.name)
        directory = write_adapter(root / f"{self._lora_ids:06d}", self.lora, self.model_path, state)
        for old in sorted(root.iterdir())[:-KEEP_ADAPTERS]:
            shutil.rmtree(old, ignore_errors=True)
        return f"rollcut-v{version}", self._lora_ids, str(directory)

    def _check_shapes(self, version: int, state: Mapping[str, Any]) -> None:
        missing = sorted(k for k in self._shapes if k not in state)
        wrong = sorted(k for k, shape in self._shapes.items() if k in state and tuple(state[k].shape) != shape)
        if missing or wrong:
            raise ValueError(
                f"weights for version {version} do not fit {self.model_path} "
                f"(missing {missing[:5]}, wrong shapes {wrong[:5]})"
            )
