"""The gpt-oss-style mixture-of-experts decoder of ``gpt_oss_moe.py``, one decode step:
``[batch, 1]`` token ids at position ``context`` -> logits, against a static KV cache holding
``context`` earlier tokens.

The cache is the model's state (``kforge/models/decode.py``): the full-attention layers hold
``context + 1`` slots and the step writes slot ``context``; the sliding-window layers hold the
context's last ``window`` tokens and the step rolls a copy of them, as ``transformers`` does,
so every call gives the same logits. Widths as ``gpt_oss_moe.py`` (gpt-oss-20b's); the ``ci``
preset is a tiny float32 model whose context (24) is longer than its window (8), so both kinds
of layer run the paths they run at 2k. Needs ``pip install -e '.[models]'``.
"""

import torch
from transformers import GptOssConfig, GptOssForCausalLM

from kforge.models.decode import DecodeStep

batch = 1
context = 2048
hidden = 2880
heads = 64
kv_heads = 8
head_dim = 64
experts = 32
routed = 4
expert_width = 2880
window = 128
vocab = 201088
layers = 2
bf16 = 1  # weights, activations and the cache in bfloat16 (0: float32)
PRESETS = {"ci": {"batch": 1, "context": 24, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "experts": 4,
                  "routed": 2, "expert_width": 64, "window": 8, "vocab": 256, "layers": 2, "bf16": 0}}


class Model(DecodeStep):
    def __init__(self):
        config = GptOssConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=expert_width,
                              num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                              head_dim=head_dim, num_local_experts=experts, num_experts_per_tok=routed,
                              sliding_window=window, max_position_embeddings=131072,  # gpt-oss: 4k x 32 (YaRN)
                              layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)])
        lm = GptOssForCausalLM(config).eval().to(torch.bfloat16 if bf16 else torch.float32)
        super().__init__(lm, config, batch=batch, context=context, vocab=vocab)


def get_inputs():
    return [torch.randint(0, vocab, (batch, 1))]


def get_init_inputs():
    return []
