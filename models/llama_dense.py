"""A Llama-style dense decoder: prefill, ``[batch, seq]`` token ids -> logits.

Built from a ``transformers`` LlamaConfig with random weights (nothing is downloaded): the widths
of a 1B-class Llama (hidden 2048, 32 heads of 64 with 8 KV heads, SiLU-gated MLP of 8192, vocab
32000), ``layers`` of them (the GPU budget decides how many: every layer is the same cell, so
more layers cost time, not compile work), bf16 weights on a GPU. The ``ci`` preset is a tiny
float32 model for the CPU tests, ``ci_bf16`` the same in bf16. Needs ``pip install -e '.[models]'``.
"""

import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaForCausalLM

batch = 1
seq = 2048
hidden = 2048
heads = 32
kv_heads = 8
intermediate = 8192
vocab = 32000
layers = 4
bf16 = 1  # weights and activations in bfloat16 (0: float32)
PRESETS = {"ci": {"batch": 1, "seq": 16, "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128,
                  "vocab": 256, "layers": 2, "bf16": 0}}
PRESETS["ci_bf16"] = {**PRESETS["ci"], "bf16": 1}  # the tiny model as the GPU runs it: bf16 weights


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                             max_position_embeddings=max(seq, 128))
        self.lm = LlamaForCausalLM(config).eval()
        if bf16:
            self.lm = self.lm.to(torch.bfloat16)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids, use_cache=False).logits


def get_inputs():
    return [torch.randint(0, vocab, (batch, seq))]


def get_init_inputs():
    return []
