"""Speculative decoding: drafts in the batch, verification by the rejection sampler,
and the proposers (n-gram, draft model, EAGLE), which see the runner only through
``interface.TargetRunner``."""
