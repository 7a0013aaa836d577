"""The model's forward pass over a `TokenBatch` (padded or packed), as every actor backend, the
reference, NTHR and GCD's classifier run it: the final hidden states of the trained tokens, and
their log-probs through the fused kernel."""

from __future__ import annotations

import torch

from agentrl.distributed import model_device
from agentrl.kernels import linear_logprob
from agentrl.packing import TokenBatch, tree_attention


def trained_hidden(model, batch: TokenBatch) -> torch.Tensor:
    """(N, H): the final hidden state at each position that predicts a trained token."""
    batch = batch.to(model_device(model))
    attention = batch.attention_mask
    if batch.subtree_end is not None:  # packed rows: the prefix tree's own 4-D mask
        attention = tree_attention(model, batch.subtree_end)
    hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=attention,
                                 position_ids=batch.position_ids).last_hidden_state  # (B, L, H)
    if batch.predict is not None:
        return hidden.flatten(0, 1)[batch.predict]
    return hidden[:, :-1][batch.mask[:, 1:]]  # position t-1 predicts token t


def response_logprobs(model, batch: TokenBatch, temperature: float = 1.0, entropy: bool = False):
    """log p (N,) of the trained tokens (and their entropy when asked), projecting only their
    hidden states through the lm_head with the fused kernel: prompt positions never reach the
    output layer, and not even the (N, V) logits of the trained tokens are materialised.
    """
    hidden = trained_hidden(model, batch)
    batch = batch.to(hidden.device)
    targets = batch.input_ids[batch.mask]  # (N,), in the order of the hidden states
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("the fused log-prob assumes an lm_head without bias")
    logp, ent = linear_logprob(hidden, head.weight, targets, temperature)
    return logp, (ent if entropy else None)
