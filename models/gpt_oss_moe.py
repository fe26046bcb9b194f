"""A gpt-oss-style mixture-of-experts decoder: prefill, ``[batch, seq]`` token ids -> logits.

Built from a ``transformers`` GptOssConfig with random weights (nothing is downloaded): the public
gpt-oss-20b widths (hidden 2880, 64 heads of 64 with 8 KV heads, 32 experts of 2880 with 4 routed a
token, sliding-window attention of 128 on every other layer, vocab 201088), ``layers`` of them (the
GPU budget decides how many), bf16 weights on a GPU. The ``ci`` preset is a tiny float32 model for
the CPU tests. Needs ``pip install -e '.[models]'``.
"""

import torch
import torch.nn as nn
from transformers import GptOssConfig, GptOssForCausalLM

batch = 1
seq = 2048
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
bf16 = 1  # weights and activations in bfloat16 (0: float32)
PRESETS = {"ci": {"batch": 1, "seq": 16, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "experts": 4,
                  "routed": 2, "expert_width": 64, "window": 8, "vocab": 256, "layers": 2, "bf16": 0}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = GptOssConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=expert_width,
                              num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                              head_dim=head_dim, num_local_experts=experts, num_experts_per_tok=routed,
                              sliding_window=window, max_position_embeddings=131072,  # gpt-oss: 4k x 32 (YaRN)
                              layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)])
        self.lm = GptOssForCausalLM(config).eval()
        if bf16:
            self.lm = self.lm.to(torch.bfloat16)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids, use_cache=False).logits


def get_inputs():
    return [torch.randint(0, vocab, (batch, seq))]


def get_init_inputs():
    return []
