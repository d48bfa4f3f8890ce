"""State kept across engine steps: per-request state, the async token feed,
prompt logprobs gathered chunk by chunk."""
