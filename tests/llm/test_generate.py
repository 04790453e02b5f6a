from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from fedqueue.errors import ConfigError
from fedqueue.llm.converted import resolve_dtype
from fedqueue.llm.generate import Generation, PromptIn, generate_batch
from fedqueue.llm.model import LoadedModel, load_model
from fedqueue.llm.settings import GenerationSettings
from fedqueue.llm.tiny import build_tokenizer

GREEDY = GenerationSettings(max_new_tokens=24)


def _prompts(count: int, seed: int = 3, longest: int = 90) -> list[PromptIn]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz ,."
    return [
        PromptIn(f"p{index}", "".join(rng.choice(letters) for _ in range(rng.randint(1, longest))))
        for index in range(count)
    ]


def _reference(loaded: LoadedModel, prompt: str, max_new_tokens: int) -> Generation:
    """A plain `generate()` call for one prompt: no padding, no batching."""
    tokenizer, model = loaded.tokenizer, loaded.model
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        output = model.generate(
            input_ids=ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    new = output[0, ids.shape[1] :].tolist()
    eos = tokenizer.eos_token_id
    stop = new.index(eos) if eos in new else None
    return Generation(
        key="",
        output=tokenizer.decode(new if stop is None else new[:stop], skip_special_tokens=True),
        prompt_tokens=ids.shape[1],
        generated_tokens=len(new) if stop is None else stop + 1,
        finish_reason="length" if stop is None else "stop",
    )


def _patch_generate(loaded: LoadedModel, fail: Any) -> list[int]:
    """Wrap the model's generate: `fail(input_ids)` may raise; returns the batch sizes generate was called with."""
    calls: list[int] = []
    real = loaded.model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["input_ids"].shape[0])
        fail(kwargs["input_ids"])
        return real(*args, **kwargs)

    loaded.model.generate = generate
    return calls


def test_batched_greedy_equals_a_loop_of_single_prompts(loaded: LoadedModel) -> None:
    prompts = _prompts(24)
    generations, stats = generate_batch(loaded, prompts, GREEDY)

    assert [generation.key for generation in generations] == [prompt.key for prompt in prompts]
    for prompt, generation in zip(prompts, generations, strict=True):
        assert prompt.prompt is not None
        expected = _reference(loaded, prompt.prompt, GREEDY.max_new_tokens)
        assert (generation.output, generation.prompt_tokens, generation.generated_tokens, generation.finish_reason) == (
            expected.output,
            expected.prompt_tokens,
            expected.generated_tokens,
            expected.finish_reason,
        ), prompt.key
        assert generation.error is None
    reasons = [generation.finish_reason for generation in generations]
    assert "stop" in reasons and "length" in reasons  # rows that ended early ran beside rows that went on
    assert all(g.generated_tokens < GREEDY.max_new_tokens for g in generations if g.finish_reason == "stop")
    assert len({generation.output for generation in generations}) > 20
    assert stats.batch_sizes_run == (24,)
    assert stats.prompt_tokens == sum(generation.prompt_tokens for generation in generations)
    assert stats.generated_tokens == sum(generation.generated_tokens for generation in generations)
    assert stats.padded_prompt_tokens == 24 * max(generation.prompt_tokens for generation in generations)
    assert 0 < stats.pad_fraction < 1


def test_chat_messages_render_with_the_template(loaded: LoadedModel) -> None:
    messages = (("system", "be brief"), ("user", "hello there"))
    chat, plain, both = generate_batch(
        loaded,
        [
            PromptIn("chat", messages=messages),
            # The same text as a plain prompt: the tokenizer adds the bos token the template writes.
            PromptIn("plain", prompt="<system>be brief\n<user>hello there\n<assistant>"),
            PromptIn("both", prompt="x", messages=messages),
        ],
        GREEDY,
    )[0]
    assert chat.error is None and chat.output
    assert (chat.output, chat.prompt_tokens, chat.generated_tokens) == (
        plain.output,
        plain.prompt_tokens,
        plain.generated_tokens,
    )
    assert both.error == "a prompt needs exactly one of prompt or messages"


def test_a_model_without_chat_template_fails_only_message_prompts(loaded: LoadedModel) -> None:
    loaded.tokenizer.chat_template = None
    chat, plain = generate_batch(
        loaded, [PromptIn("chat", messages=(("user", "hi"),)), PromptIn("plain", "hi")], GREEDY
    )[0]
    assert chat.output is None and chat.error is not None and "no chat template" in chat.error
    assert plain.error is None and plain.output is not None


def test_an_over_long_prompt_fails_alone(loaded: LoadedModel) -> None:
    prompts = [*_prompts(3), PromptIn("long", "y" * 240)]
    generations, stats = generate_batch(loaded, prompts, GREEDY)
    assert generations[3].error == (
        "prompt has 241 tokens; with max_new_tokens 24 it exceeds the model's context of 256"
    )
    assert generations[3].output is None and generations[3].prompt_tokens == 241
    assert all(generation.error is None and generation.output is not None for generation in generations[:3])
    assert stats.batch_sizes_run == (3,)


def test_out_of_memory_halves_the_batch_and_remembers_the_size(loaded: LoadedModel) -> None:
    prompts = _prompts(8)
    expected, _ = generate_batch(loaded, prompts, GREEDY)

    def fail(input_ids: torch.Tensor) -> None:
        if input_ids.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    calls = _patch_generate(loaded, fail)
    generations, stats = generate_batch(loaded, prompts, GREEDY)
    assert generations == expected
    assert calls == [8, 4, 2, 2, 2, 2]
    assert stats.batch_sizes_run == (2, 2, 2, 2)
    assert loaded.max_batch == 2

    calls.clear()
    generations, stats = generate_batch(loaded, prompts[:5], GREEDY)
    assert calls == [2, 2, 1]  # cut to the remembered size at once
    assert generations == expected[:5]


def test_a_prompt_that_runs_out_of_memory_alone_fails_alone(loaded: LoadedModel) -> None:
    prompts = [*_prompts(5), PromptIn("huge", "####")]
    marker = loaded.tokenizer.convert_tokens_to_ids("#")

    def fail(input_ids: torch.Tensor) -> None:
        if bool((input_ids == marker).any()):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    _patch_generate(loaded, fail)
    generations, _ = generate_batch(loaded, prompts, GREEDY)
    huge = generations[-1]
    assert huge.output is None and huge.error is not None
    assert huge.error.startswith("out of memory on cpu for this prompt alone (5 tokens")
    assert all(generation.error is None and generation.output is not None for generation in generations[:-1])


def test_a_poisoned_prompt_fails_alone(loaded: LoadedModel) -> None:
    prompts = [*_prompts(6), PromptIn("poison", "a~b")]
    expected, _ = generate_batch(loaded, prompts[:-1], GREEDY)
    marker = loaded.tokenizer.convert_tokens_to_ids("~")

    def fail(input_ids: torch.Tensor) -> None:
        if bool((input_ids == marker).any()):
            raise ValueError("poisoned input\nsecond line")

    calls = _patch_generate(loaded, fail)
    generations, stats = generate_batch(loaded, prompts, GREEDY)
    assert generations[-1].error == "ValueError: poisoned input"
    assert generations[:-1] == expected
    assert calls == [7, 1, 1, 1, 1, 1, 1, 1]
    assert stats.batch_sizes_run == (1,) * 6
    assert loaded.max_batch is None  # a failure that is not about memory leaves batch sizes alone


def test_sampling_is_seeded_per_prompt_not_per_batch(loaded: LoadedModel) -> None:
    prompts = _prompts(12, seed=7)
    sampled = GenerationSettings(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=11)
    batched, _ = generate_batch(loaded, prompts, sampled)
    alone = [generate_batch(loaded, [prompt], sampled)[0][0] for prompt in prompts]
    assert batched == alone
    reversed_batch, _ = generate_batch(loaded, prompts[::-1], sampled)
    assert reversed_batch[::-1] == batched
    greedy, _ = generate_batch(loaded, prompts, GenerationSettings(max_new_tokens=16))
    other_seed, _ = generate_batch(loaded, prompts, GenerationSettings(max_new_tokens=16, temperature=1.0, seed=12))
    assert [g.output for g in batched] != [g.output for g in greedy]
    assert [g.output for g in batched] != [g.output for g in other_seed]


def test_tiny_tokenizer_round_trips_text(loaded: LoadedModel) -> None:
    text = "Hello, world!\n{x: [1, 2]} ~`"
    ids = build_tokenizer()(text)["input_ids"]
    assert len(ids) == len(text) + 1  # one token a character, after bos
    assert loaded.tokenizer.decode(ids, skip_special_tokens=True) == text
    assert loaded.context_length == 256 and loaded.dtype == torch.float32 and loaded.device.type == "cpu"
    assert loaded.tokenizer.padding_side == "left"


def test_settings_round_trip() -> None:
    settings = GenerationSettings(max_new_tokens=8, temperature=0.7, top_p=0.9, seed=3, dtype="bfloat16")
    assert GenerationSettings.from_dict(settings.to_dict()) == settings
    assert GenerationSettings.from_dict({}) == GenerationSettings()
    assert GenerationSettings.from_dict({"temperature": 1}).temperature == 1.0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens: must be an integer from 1 to 100000"),
        ({"max_new_tokens": 2.5}, "max_new_tokens: must be an integer from 1 to 100000"),
        ({"max_new_tokens": True}, "max_new_tokens: must be an integer from 1 to 100000"),
        ({"temperature": -0.1}, "temperature: "),
        ({"temperature": float("nan")}, "temperature: "),
        ({"top_p": 0}, "top_p: "),
        ({"top_p": 1.5}, "top_p: "),
        ({"seed": -1}, "seed: "),
        ({"dtype": "int8"}, "dtype: must be one of auto, float32, bfloat16, float16"),
        ({"backend": ""}, "backend: must be the name of a backend"),
        ({"beams": 4}, "beams: unknown generation setting"),
    ],
)
def test_settings_errors_name_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        GenerationSettings.from_dict(raw)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_resolve_dtype_on_cpu() -> None:
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_a_missing_model_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match="no-such-model"):
        load_model(str(missing))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=f"model {empty}: cannot be loaded"):
        load_model(str(empty))


def test_a_gguf_model_without_gguf_installed_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_gguf_available", lambda *args, **kwargs: False)
    model = tmp_path / "model.Q4_K_M.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match=r"pip install fedqueue\[gguf\]"):
        load_model(str(model))
