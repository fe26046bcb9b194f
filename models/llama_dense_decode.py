"""The Llama-style dense decoder of ``llama_dense.py``, one decode step: ``[batch, 1]`` token ids at
position ``context`` -> logits, against a static KV cache holding ``context`` earlier tokens.

The cache is the model's state, as in a serving engine: per layer a key and a value buffer of
``[batch, kv_heads, context + 1, head_dim]``, filled at construction by the model's own prefill
of a random ``context``-token prompt; a step writes slot ``context`` and attends over all of
them, the same values again on every call (``kforge/models/decode.py`` says why it is built so).

Widths as ``llama_dense.py`` (a 1B-class Llama); the ``ci`` preset is a tiny float32 model.
Needs ``pip install -e '.[models]'``.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from kforge.models.decode import DecodeStep

batch = 1
context = 2048
hidden = 2048
heads = 32
kv_heads = 8
intermediate = 8192
vocab = 32000
layers = 4
bf16 = 1  # weights, activations and the cache in bfloat16 (0: float32)
PRESETS = {"ci": {"batch": 1, "context": 24, "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128,
                  "vocab": 256, "layers": 2, "bf16": 0}}


class Model(DecodeStep):
    def __init__(self):
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                             max_position_embeddings=max(context + 1, 128))
        lm = LlamaForCausalLM(config).eval().to(torch.bfloat16 if bf16 else torch.float32)
        super().__init__(lm, config, batch=batch, context=context, vocab=vocab)


def get_inputs():
    return [torch.randint(0, vocab, (batch, 1))]


def get_init_inputs():
    return []
