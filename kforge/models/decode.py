"""One decode step of a ``transformers`` causal LM against a static KV cache the model holds.

The cache is the model's state, as in a serving engine: ``transformers``' StaticCache, filled at
construction by the model's own prefill of a random ``context``-token prompt, its layers' tensors
registered as buffers (so they move with ``.to(device)`` and are lent to a stitched forward like
any parameter). A step is idempotent, because the verifier calls a model many times and compares
the answers:

- a full-attention layer holds ``context + 1`` slots; the step writes its token's key and value
  at slot ``context`` (``index_copy_``) and attends over all of them. The same step again writes
  the same values to the same slot.
- a sliding-window layer holds the last ``window`` tokens; ``transformers`` rolls that window
  left by one and appends the new token. Rolling the buffer itself would shift the state on
  every call, so the step rolls a copy of it (``window`` rows per layer, what the rolling costs
  anyway) and the buffer keeps the context's window.

The cache is not an input and an output: an output that aliases an input, or an input changed
in place, is what the verifier rejects, and copying a 2k-token cache per step to make the step
functional would be its largest cost (docs/MODELS.md).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn


class DecodeStep(nn.Module):
    """``forward(ids [batch, 1]) -> logits`` of ``lm`` at position ``context``."""

    def __init__(self, lm: nn.Module, config: Any, *, batch: int, context: int, vocab: int) -> None:
        from transformers import StaticCache

        super().__init__()
        self.lm, self.context = lm, context
        self.cache = StaticCache(config=config, max_cache_len=context + 1)
        prompt = torch.randint(0, vocab, (batch, context))
        self.prompt = prompt  # not a buffer: the step never reads it (a test decodes it whole)
        with torch.no_grad():  # the context's keys and values, from the model's own prefill
            self.lm(prompt, past_key_values=self.cache, use_cache=True)
        for i, layer in enumerate(self.cache.layers):
            self.register_buffer(f"k{i}", layer.keys)
            self.register_buffer(f"v{i}", layer.values)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        device = input_ids.device
        for i, layer in enumerate(self.cache.layers):  # the buffers, wherever the model now lives
            keys, values = getattr(self, f"k{i}"), getattr(self, f"v{i}")
            if getattr(layer, "is_sliding", False):  # rolled: a copy, so the buffer keeps the window
                keys, values = keys.clone(), values.clone()
                layer.cumulative_length_int = self.context
            layer.keys, layer.values, layer.device = keys, values, device
            layer.cumulative_length = torch.full((), self.context, dtype=torch.long, device=device)
        position = torch.full((1,), self.context, dtype=torch.long, device=device)
        return self.lm(input_ids, past_key_values=self.cache, cache_position=position, use_cache=True).logits
