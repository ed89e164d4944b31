"""The embedded tiny torch LM policy (CPU default): word tokenizer, GPT with KV cache, batching server.

`torch_tiny_backend` is the registered backend (`stages.policy.POLICIES["torch_tiny"]`); see
docs/policy.md for the model, prompt format, batching / cancellation semantics and the BC warm start.
"""

from ._build import TinyOptions as TinyOptions
from ._build import torch_tiny_backend as torch_tiny_backend
from ._generate import generate as generate
from ._model import ModelConfig as ModelConfig
from ._model import TinyLM as TinyLM
from ._prompt import PromptFormat as PromptFormat
from ._prompt import parse_action as parse_action
from ._server import SamplingConfig as SamplingConfig
from ._server import TorchTinyPolicy as TorchTinyPolicy
from ._tokenizer import WordTokenizer as WordTokenizer

__all__ = [
    "ModelConfig",
    "PromptFormat",
    "SamplingConfig",
    "TinyLM",
    "TinyOptions",
    "TorchTinyPolicy",
    "WordTokenizer",
    "generate",
    "parse_action",
    "torch_tiny_backend",
]
