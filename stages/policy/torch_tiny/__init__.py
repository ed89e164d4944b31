"""The embedded tiny torch LM policy (CPU default): word tokenizer, GPT with KV cache, batching server.

`build_policy` is the registered backend entry (`stages.policy.POLICIES["torch_tiny"]`); see
docs/policy.md for the model, prompt format, batching / cancellation semantics and the BC warm start.
"""

from ._build import TinyOptions as TinyOptions
from ._build import build_policy as build_policy
from ._generate import generate as generate
from ._model import ModelConfig as ModelConfig
from ._model import TinyLM as TinyLM
from ._prompt import PromptFormat as PromptFormat
from ._prompt import parse_action as parse_action
from ._server import PolicyStopped as PolicyStopped
from ._server import SamplingConfig as SamplingConfig
from ._server import TorchTinyPolicy as TorchTinyPolicy
from ._tokenizer import WordTokenizer as WordTokenizer

__all__ = [
    "ModelConfig",
    "PolicyStopped",
    "PromptFormat",
    "SamplingConfig",
    "TinyLM",
    "TinyOptions",
    "TorchTinyPolicy",
    "WordTokenizer",
    "build_policy",
    "generate",
    "parse_action",
]
