"""The Llama-style dense decoder of ``llama_dense.py``, one decode step: ``[batch, 1]`` token ids at
position ``context`` -> logits, against a static KV cache holding ``context`` earlier tokens.

The cache is the model's state, as in a serving engine: per layer a key and a value buffer of
``[batch, kv_heads, context + 1, head_dim]`` (``transformers``' StaticCache layers, their
tensors registered as buffers so they move with the model), filled at construction with the keys
and values of a random prompt of ``context`` tokens run through the model's own prefill. A step
writes its token's key and value at slot ``context`` and attends over all ``context + 1`` slots;
the same step again writes the same slot with the same values, so every call gives the same
logits (the verifier calls a model many times). The cache is not an input and an output: an
output aliasing an input, or an input changed in place, is what the verifier rejects, and a
copy of a 2k-token cache per step would be the step's largest cost.

Widths as ``llama_dense.py`` (a 1B-class Llama); the ``ci`` preset is a tiny float32 model.
Needs ``pip install -e '.[models]'``.
"""

import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

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


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                             max_position_embeddings=max(context + 1, 128))
        self.lm = LlamaForCausalLM(config).eval()
        dtype = torch.bfloat16 if bf16 else torch.float32
        self.lm = self.lm.to(dtype)
        self.cache = StaticCache(config=config, max_cache_len=context + 1)
        prompt = torch.randint(0, vocab, (batch, context))
        with torch.no_grad():  # the context's keys and values, from the model's own prefill
            self.lm(prompt, past_key_values=self.cache, use_cache=True)
        for i, layer in enumerate(self.cache.layers):
            self.register_buffer(f"k{i}", layer.keys)
            self.register_buffer(f"v{i}", layer.values)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        position = torch.full((1,), context, dtype=torch.long, device=input_ids.device)
        for i, layer in enumerate(self.cache.layers):  # the buffers where the model now lives
            layer.keys, layer.values = getattr(self, f"k{i}"), getattr(self, f"v{i}")
            layer.device = input_ids.device
            layer.cumulative_length = torch.full((), context, dtype=torch.long, device=input_ids.device)
        out = self.lm(input_ids, past_key_values=self.cache, cache_position=position, use_cache=True)
        return out.logits


def get_inputs():
    return [torch.randint(0, vocab, (batch, 1))]


def get_init_inputs():
    return []
