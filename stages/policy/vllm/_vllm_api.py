"""The few vLLM objects rollcut builds or reads, each behind one function (vLLM is imported lazily, so a
machine without it can still import the backend): one request's `SamplingParams`, a `LoRARequest`, the
engine-core process ids behind an `AsyncLLM`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TOP_P = 1.0
"""What the backend samples and scores with, whatever `policy.top_p` says: no nucleus. The engine reports no
token's nucleus, so a learner recomputing a top-p boundary (in another batch, with other padding) could move a
token in or out of it and make a turn's log-prob depend on its batch (`PolicyBackend.records_nucleus`)."""


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 12
    fuzzy_cutoff: float = 75.0
    seeded: bool = False
    """Seed every request from (policy seed, request number), as torch_tiny does (see VllmOptions)."""


def sampling_params(s: Sampling, *, greedy: bool, seed: int | None, stop_token_ids: list[int]) -> Any:
    """vLLM `SamplingParams` of one request: final output only, the sampled token's log-prob."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    greedy = greedy or s.temperature <= 0
    return SamplingParams(
        n=1,
        temperature=0.0 if greedy else s.temperature,
        top_p=1.0 if greedy else s.top_p,
        max_tokens=s.max_new_tokens,
        stop_token_ids=stop_token_ids,
        logprobs=0,
        seed=None if greedy else seed,
        output_kind=RequestOutputKind.FINAL_ONLY,
        skip_special_tokens=True,
    )


def lora_request(name: str, lora_id: int, path: str) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)


def engine_process_ids(engine: Any) -> list[int]:
    """PIDs of the engine-core processes behind an AsyncLLM (empty when it runs in-process)."""
    resources = getattr(getattr(engine, "engine_core", None), "resources", None)
    procs = getattr(getattr(resources, "engine_manager", None), "processes", None) or []
    return [p.pid for p in procs if getattr(p, "pid", None)]
