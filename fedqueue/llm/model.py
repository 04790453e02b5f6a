"""Loading a causal language model and its tokenizer from local files (a folder, a cached hub id or a GGUF file)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedqueue.errors import ConfigError
from fedqueue.llm.converted import converted, resolve_dtype
from fedqueue.llm.model_files import CONTEXT_FIELDS

log = logging.getLogger(__name__)

UNKNOWN_CONTEXT = 1_000_000_000  # a model that states no context length is not held to one here


@dataclass
class LoadedModel:
    """A model ready to generate, and what generation needs to know about it."""

    model: Any
    tokenizer: Any
    device: torch.device  # where inputs go (the first shard's device for a model spread over several GPUs)
    dtype: torch.dtype
    context_length: int
    name: str
    max_batch: int | None = None  # the largest batch that ran without running out of memory, once one did


def load_model(
    name_or_path: str,
    dtype: str = "auto",
    device: str | None = None,
    device_map: str | None = None,
    cache: Path | None = None,
) -> LoadedModel:
    """Load from local files only (never a download); raise ConfigError naming the model when that fails.

    A GGUF file is read from its converted copy in `cache` (the model cache's folder), converted there first
    where no process on this host has yet; without `cache`, from the file itself.
    """
    path = Path(name_or_path).expanduser()
    gguf_file: str | None = None
    folder = str(path)
    if path.suffix.lower() == ".gguf":
        _require_gguf(name_or_path)
        gguf_file, folder = path.name, str(path.parent)
        if not path.is_file():
            raise ConfigError(f"model {name_or_path}: no such GGUF file")
    elif _looks_like_path(name_or_path) and not path.exists():
        raise ConfigError(f"model {name_or_path}: no such file or directory")

    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch_dtype = resolve_dtype(dtype, target)
    if gguf_file is not None and cache is not None:
        folder, gguf_file = _converted_folder(path, torch_dtype, cache)
    extra: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer: Any = AutoTokenizer.from_pretrained(folder, local_files_only=True, **extra)
        model: Any = AutoModelForCausalLM.from_pretrained(
            folder, local_files_only=True, dtype=torch_dtype, device_map=device_map, **extra
        )
    except Exception as error:
        raise ConfigError(f"model {name_or_path}: cannot be loaded ({_one_line(error)})") from error

    if device_map is None:
        model.to(target)
    else:
        target = model.device  # inputs go where the embeddings are
    model.eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ConfigError(f"model {name_or_path}: its tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=target,
        dtype=torch_dtype,
        context_length=context_length(model.config),
        name=name_or_path,
    )


def _converted_folder(gguf: Path, dtype: torch.dtype, cache: Path) -> tuple[str, str | None]:
    """Where to load a GGUF file from: its converted folder, or the file itself where the cache cannot be written."""
    try:
        return str(converted(gguf, dtype, cache).folder), None
    except OSError as error:  # a full disk or a cache folder not ours: slower, but the job goes on
        log.warning("model cache %s: %s; reading %s directly", cache, _one_line(error), gguf)
        return str(gguf.parent), gguf.name
    except Exception as error:
        raise ConfigError(f"model {gguf}: cannot be loaded ({_one_line(error)})") from error


def context_length(config: Any) -> int:
    for field in CONTEXT_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int) and value > 0:
            return value
    return UNKNOWN_CONTEXT


def _require_gguf(name: str) -> None:
    from transformers.utils import is_accelerate_available, is_gguf_available

    if not (is_gguf_available() and is_accelerate_available()):
        raise ConfigError(
            f"model {name}: reading GGUF files needs the gguf and accelerate packages "
            "(pip install fedqueue[gguf], or pip install gguf accelerate)"
        )


def _looks_like_path(name: str) -> bool:
    """A hub id ("org/model") may be in the local cache; anything else naming a file system place must exist."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
