"""GGUF models converted once per host: dequantized into a `save_pretrained` folder that later loads read in seconds.

transformers reads a GGUF file by parsing its metadata in Python and dequantizing every tensor: most of a minute
for a 135M model on a CPU, paid again by every worker process and every job. The first load on a host writes what
it read into the model cache (FEDQUEUE_MODEL_CACHE), one folder per file (its path, size and modification time),
dtype and transformers version; a file lock makes other processes wait for that conversion instead of making their
own. `python -m fedqueue.llm.converted MODEL DTYPE` fills the cache in a process of its own, so a submit that starts
its workers here can start converting before they are up.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedqueue.errors import ConfigError

if TYPE_CHECKING:
    import torch

MARKER = "fedqueue-source.json"  # written last, before the rename: a folder with it is whole
OFF = "off"


@dataclass(frozen=True)
class Converted:
    folder: Path
    converted_here: bool  # False: it was in the cache already, or another process converted it meanwhile


def cache_root(setting: str | None) -> Path | None:
    """The model cache's folder: FEDQUEUE_MODEL_CACHE, else the user's cache folder; None when set to "off"."""
    if setting == OFF:
        return None
    if setting:
        return Path(setting).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fedqueue" / "models"


def entry_name(gguf: Path, dtype: str) -> str:
    """The cache folder's name: the file's name, the dtype, and a hash of what makes its conversion differ."""
    stat = gguf.stat()
    source = [str(gguf.resolve()), stat.st_size, stat.st_mtime_ns, dtype, version("transformers"), version("gguf")]
    digest = hashlib.sha256(json.dumps(source).encode()).hexdigest()[:16]
    return f"{gguf.stem}-{dtype}-{digest}"


def cached(gguf: Path, dtype: str, root: Path) -> Path | None:
    """The converted folder of this file and dtype, where the cache holds it whole."""
    folder = root / entry_name(gguf, dtype)
    return folder if (folder / MARKER).is_file() else None


def converted(gguf: Path, dtype: Any, root: Path) -> Converted:
    """The folder holding `gguf` dequantized to `dtype` (a torch dtype), converting it first where no process has."""
    from filelock import FileLock

    name = str(dtype).removeprefix("torch.")
    found = cached(gguf, name, root)
    if found is not None:
        return Converted(found, converted_here=False)
    root.mkdir(parents=True, exist_ok=True)
    folder = root / entry_name(gguf, name)
    with FileLock(f"{folder}.lock"):
        if (folder / MARKER).is_file():  # converted by the process this one waited for
            return Converted(folder, converted_here=False)
        # Leftovers of a conversion killed half-way (every converter holds this lock, so none is running).
        for stale in root.glob(f".{folder.name}.*.partial"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = root / f".{folder.name}.{os.getpid()}.partial"
        try:
            _convert(gguf, dtype, staging)
            source = {"gguf": str(gguf.resolve()), "size": gguf.stat().st_size, "dtype": name}
            (staging / MARKER).write_text(json.dumps(source) + "\n", encoding="utf-8")
            shutil.rmtree(folder, ignore_errors=True)  # an unfinished folder has no marker
            os.replace(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return Converted(folder, converted_here=True)


def _convert(gguf: Path, dtype: Any, folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {"gguf_file": gguf.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **extra)
    model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=dtype, **extra)
    # Dequantized, the weights are plain tensors; transformers refuses to save a model it still marks as GGUF.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def convert_in_background(model: str, dtype: str, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """Start filling the cache for a GGUF model in a process of its own (None where there is nothing to convert).

    Its own process: the conversion is pure Python, and beside the caller's threads it would hold the GIL they need.
    """
    path = Path(model)
    if path.suffix.lower() != ".gguf" or not path.is_file() or cache_root(env.get("FEDQUEUE_MODEL_CACHE")) is None:
        return None
    command = [sys.executable, "-m", "fedqueue.llm.converted", str(path), dtype]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """float32 on a CPU; on a GPU bfloat16 where it is supported, else float16; or the dtype asked for."""
    import torch

    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    named = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in named:
        raise ConfigError(f"dtype: must be one of auto, {', '.join(named)}")
    return named[dtype]


def main(argv: list[str]) -> int:
    """Convert MODEL (a .gguf file) for DTYPE (a `--dtype` value) as a worker on this host would load it."""
    import torch

    from fedqueue.config import Settings

    root = cache_root(Settings.from_env().model_cache)
    if root is None:
        return 0
    target = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    converted(Path(argv[0]), resolve_dtype(argv[1], target), root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
