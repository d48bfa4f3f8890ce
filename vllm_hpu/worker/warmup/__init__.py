"""Before serving: every bucket run once through the runner, and the device memory
split between the KV cache and graphs."""
