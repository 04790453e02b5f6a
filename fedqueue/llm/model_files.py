"""What a model's files say before any worker loads it: whether they can be a model at all, the context
length, whether the tokenizer has a chat template, and the tokenizer file that counts prompt tokens.

Read at submit, from a model folder, a model in the local Hugging Face cache or a GGUF file's header.
No torch and no transformers here: submitting stays quick.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# Config fields that hold a model's context length, by model family; the first one present wins.
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
WEIGHT_SUFFIXES = (".safetensors", ".bin")  # shards and their index files end so too
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tekken.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelFacts:
    """What is known of a model here; None where its files do not say (or are not on this machine)."""

    context_length: int | None = None
    chat_template: bool | None = None
    tokenizer_json: Path | None = None  # counts prompt tokens exactly, as the worker's tokenizer does
    scaled_context: bool = False  # RoPE scaling: vLLM may stretch the context beyond the config's length


def model_problem(path: Path) -> str | None:
    """Why the model at `path` (a folder or a file that is there) cannot be loaded; None where it looks whole."""
    if path.is_dir():
        return _folder_problem(path)
    if not path.is_file():
        return "neither a folder nor a file"
    if path.suffix.lower() == ".gguf":
        try:
            with path.open("rb") as file:
                magic = file.read(len(GGUF_MAGIC))
        except OSError as error:
            return f"cannot read it ({error.strerror})"
        return None if magic == GGUF_MAGIC else "not a GGUF file (it does not start with GGUF's magic bytes)"
    if path.name == "config.json" or path.suffix.lower() in WEIGHT_SUFFIXES:
        return f"a file of a model; give the folder that holds it ({path.parent})"
    return "a file, not a model: give a model folder (what save_pretrained writes) or a .gguf file"


def _folder_problem(folder: Path) -> str | None:
    try:
        entries = list(folder.iterdir())
        names = {entry.name for entry in entries if entry.is_file()}
    except OSError as error:
        return f"cannot read the folder ({error.strerror})"
    missing = []
    if "config.json" not in names:
        missing.append("config.json")
    if not any(name.endswith(WEIGHT_SUFFIXES) for name in names):
        missing.append("weights (*.safetensors or pytorch_model.bin)")
    if not names.intersection(TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json or tokenizer.model)")
    if missing:
        what = "an empty folder" if not entries else "not a model folder"
        ggufs = sorted(name for name in names if name.lower().endswith(".gguf"))
        hint = f"; for a GGUF model give the file itself ({folder / ggufs[0]})" if ggufs else ""
        return f"{what}: no {', no '.join(missing)} in it{hint}"
    if not isinstance(_read_json(folder / "config.json"), dict):
        return "config.json is not a JSON object"
    return None


def model_folder(model: str) -> Path | None:
    """The folder holding the model's files here: the folder given, or a cached hub model's snapshot."""
    path = Path(model)
    if path.is_dir():
        return path
    if path.exists() or model.startswith(("/", ".", "~")) or model.count("/") > 1:
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # noqa: BLE001 - not a name the hub's cache can hold ("a b"): no model here
        return None
    return Path(found).parent if isinstance(found, str) else None


def model_facts(model: str) -> ModelFacts:
    """What the model's files here say about it; an empty ModelFacts where they are not here or say nothing."""
    path = Path(model)
    if path.suffix.lower() == ".gguf" and path.is_file():
        return _gguf_facts(path)
    folder = model_folder(model)
    if folder is None:
        return ModelFacts()
    config = _read_json(folder / "config.json")
    config = config if isinstance(config, dict) else {}
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    chat_template = any((folder / name).is_file() for name in CHAT_TEMPLATE_FILES) or bool(
        isinstance(tokenizer_config, dict) and tokenizer_config.get("chat_template")
    )
    tokenizer_json = folder / "tokenizer.json"
    return ModelFacts(
        context_length=context_from_config(config),
        chat_template=chat_template,
        tokenizer_json=tokenizer_json if tokenizer_json.is_file() else None,
        scaled_context=_rope_scaled(config),
    )


def context_from_config(config: dict[str, Any]) -> int | None:
    """The context length a config.json states (the fields transformers' config carries), or None."""
    for field in CONTEXT_FIELDS:
        value = config.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _rope_scaled(config: dict[str, Any]) -> bool:
    """Whether the config scales RoPE (`rope_scaling`, or transformers 5's `rope_parameters` of a type not default)."""
    for field in ("rope_scaling", "rope_parameters"):
        value = config.get(field)
        if isinstance(value, dict) and value.get("rope_type", value.get("type", "default")) != "default":
            return True
    return False


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _gguf_facts(path: Path) -> ModelFacts:
    """A GGUF file's context length and chat template, from its header (the tokenizer is not counted here)."""
    try:
        metadata = gguf_metadata(path)
    except (OSError, ValueError, struct.error):
        return ModelFacts()
    architecture = metadata.get("general.architecture")
    context = metadata.get(f"{architecture}.context_length")
    return ModelFacts(
        context_length=context if isinstance(context, int) and context > 0 else None,
        chat_template=bool(metadata.get("tokenizer.chat_template")),
        scaled_context=f"{architecture}.rope.scaling.type" in metadata,
    )


# GGUF's value types, as its specification numbers them: the fixed-size ones by struct format.
_GGUF_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_metadata(path: Path) -> dict[str, Any]:
    """A GGUF file's key-value metadata, arrays left out (the tokenizer's vocabulary is skipped, not kept).

    Only the header is read, never the tensors. Raises ValueError where the file is not GGUF version 2 or 3.
    """
    with path.open("rb") as file:
        if file.read(4) != GGUF_MAGIC:
            raise ValueError("not a GGUF file")
        version = _unpack(file, "<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not read here")
        _unpack(file, "<Q")  # tensor count
        values: dict[str, Any] = {}
        for _ in range(_unpack(file, "<Q")):
            key = _string(file)
            kind = _unpack(file, "<I")
            if kind == _GGUF_ARRAY:
                _skip_array(file)
            else:
                values[key] = _value(file, kind)
        return values


def _unpack(file: IO[bytes], fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = file.read(size)
    if len(data) != size:
        raise ValueError("GGUF header cut short")
    return struct.unpack(fmt, data)[0]


def _string(file: IO[bytes]) -> str:
    length = _unpack(file, "<Q")
    data = file.read(length)
    if len(data) != length:
        raise ValueError("GGUF header cut short")
    return data.decode("utf-8", errors="replace")


def _value(file: IO[bytes], kind: int) -> Any:
    if kind == _GGUF_STRING:
        return _string(file)
    if kind not in _GGUF_FIXED:
        raise ValueError(f"GGUF value type {kind} is unknown")
    return _unpack(file, _GGUF_FIXED[kind])


def _skip_array(file: IO[bytes]) -> None:
    kind, count = _unpack(file, "<I"), _unpack(file, "<Q")
    if kind in _GGUF_FIXED:
        file.seek(count * struct.calcsize(_GGUF_FIXED[kind]), 1)
        return
    for _ in range(count):
        if kind == _GGUF_STRING:
            file.seek(_unpack(file, "<Q"), 1)
        elif kind == _GGUF_ARRAY:
            _skip_array(file)
        else:
            raise ValueError(f"GGUF value type {kind} is unknown")
