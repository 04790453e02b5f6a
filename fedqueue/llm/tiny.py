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


HEADS, KV_HEADS = 4, 2  # the GGUF model's attention heads: grouped, as most GGUF models' are


def build_tiny_gguf(path: Path, *, seed: int = 0) -> Path:
    """A tiny random Llama written as a GGUF file (float32 tensors, a byte-level vocabulary), as llama.cpp writes
    one: reading it back through transformers dequantizes and converts it like a real GGUF model. Needs `gguf`."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = [*SPECIAL_TOKENS, *bytes_to_unicode().values(), "Ġt"]  # every byte, and " t": a merge needs a token
    config = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        intermediate_size=128,
        max_position_embeddings=256,
        initializer_range=0.5,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    head_dim = config.hidden_size // config.num_attention_heads
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    control, normal = int(gguf.TokenType.CONTROL), int(gguf.TokenType.NORMAL)
    writer.add_token_types([control] * len(SPECIAL_TOKENS) + [normal] * (len(tokens) - len(SPECIAL_TOKENS)))
    writer.add_token_merges(["Ġ t"])
    writer.add_pad_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(3)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, tensor in _gguf_tensors(model):
        writer.add_tensor(name, tensor.detach().float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gguf_tensors(model: LlamaForCausalLM) -> list[tuple[str, torch.Tensor]]:
    """The model's tensors under llama.cpp's names, q and k rows permuted as its converter does (readers undo it)."""

    def permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
        return (
            weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape)
        )

    tensors = [("token_embd.weight", model.model.embed_tokens.weight)]
    for index, layer in enumerate(model.model.layers):
        block = f"blk.{index}"
        attention, mlp = layer.self_attn, layer.mlp
        tensors += [
            (f"{block}.attn_norm.weight", layer.input_layernorm.weight),
            (f"{block}.attn_q.weight", permute(attention.q_proj.weight, HEADS)),
            (f"{block}.attn_k.weight", permute(attention.k_proj.weight, KV_HEADS)),
            (f"{block}.attn_v.weight", attention.v_proj.weight),
            (f"{block}.attn_output.weight", attention.o_proj.weight),
            (f"{block}.ffn_norm.weight", layer.post_attention_layernorm.weight),
            (f"{block}.ffn_gate.weight", mlp.gate_proj.weight),
            (f"{block}.ffn_up.weight", mlp.up_proj.weight),
            (f"{block}.ffn_down.weight", mlp.down_proj.weight),
        ]
    return [*tensors, ("output_norm.weight", model.model.norm.weight), ("output.weight", model.lm_head.weight)]
