"""Tiny random Llama models built in code, saved like a downloaded one, so tests and benchmarks load a real model.

The vocabulary is the printable ASCII characters, one token each, so random weights still decode to readable
text. A large weight init makes greedy outputs differ between prompts instead of repeating one token.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, processors
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3
CHARACTERS = "\n" + "".join(chr(code) for code in range(32, 127))
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (a BPE with no merges); plain prompts start with the bos token, like Llama's."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + tuple(CHARACTERS))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.add_special_tokens(list(SPECIAL_TOKENS))
    core.decoder = decoders.Fuse()  # characters join without spaces
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_llama(
    path: Path,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    intermediate: int | None = None,
    seed: int = 0,
    max_positions: int = 256,
    initializer_range: float = 0.5,
) -> Path:
    """Build a random Llama with the character tokenizer and save both into `path`; returns `path`."""
    tokenizer = build_tokenizer()
    pad_id, bos_id, eos_id, unk_id = range(len(SPECIAL_TOKENS))  # the special tokens lead the vocabulary
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=intermediate or 4 * hidden,
        max_position_embeddings=max_positions,
        initializer_range=initializer_range,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        tie_word_embeddings=False,
    )
    # A private RNG stream: building a model must not move the caller's global seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        head = model.lm_head.weight
        # Pad, bos and unk never come out (a zero row scores 0, below the best of many large logits). The eos row
        # keeps its random weights: with this init greedy decoding ends about one prompt in six within 24 tokens.
        head[[pad_id, bos_id, unk_id]] = 0.0
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_bench_llama(path: Path, *, seed: int = 0) -> Path:
    """A ~25M-parameter model (8 layers, 512 wide) with the same tokenizer, for timing generation."""
    return build_tiny_llama(
        path, layers=8, hidden=512, heads=8, intermediate=1376, seed=seed, max_positions=1024, initializer_range=0.2
    )
