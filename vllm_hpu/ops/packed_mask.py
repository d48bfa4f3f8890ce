"""The mask of a merged (packed) prompt pass: several prompts in one flat sequence,
each causal within itself and over its own cached context, blind to the others."""

import torch


def packed_allowed(
    query_owner: torch.Tensor,
    query_position: torch.Tensor,
    key_owner: torch.Tensor,
    key_position: torch.Tensor,
) -> torch.Tensor:
    """[T, K] bool: key k is visible to query t when both belong to the same
    prompt (owner >= 0) and k is not later than t in that prompt.

    query_*: [T]; key_*: [K] with the T current tokens last (key_owner[-T:] ==
    query_owner). Padding has owner -1; a query always sees itself (the current
    token on its diagonal), so padded rows come out finite.
    """
    num_queries, num_keys = query_owner.shape[0], key_owner.shape[0]
    same = (query_owner[:, None] == key_owner[None, :]) & (key_owner[None, :] >= 0)
    causal = key_position[None, :] <= query_position[:, None]
    keys = torch.arange(num_keys, device=key_owner.device)
    queries = torch.arange(num_queries, device=key_owner.device)
    diagonal = keys[None, :] == queries[:, None] + (num_keys - num_queries)
    return (same & causal) | diagonal
