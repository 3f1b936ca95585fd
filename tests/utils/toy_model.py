"""A model config small enough to count by hand, for the estimate and for specs that read a config."""

from __future__ import annotations

# A toy Qwen2: h=8, i=16, 2 layers, 2 heads, 1 kv head (head_dim 4), vocab 32, untied. Per layer:
# q 8·8+8, k 8·4+4, v 8·4+4, o 8·8 (=208), MLP 3·8·16 (=384), 2 norms (16) = 608; embeddings
# 2·32·8 = 512; final norm 8 → 2·608 + 512 + 8 = 1736.
TOY_QWEN2 = {
    "model_type": "qwen2",
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 32,
    "tie_word_embeddings": False,
}
