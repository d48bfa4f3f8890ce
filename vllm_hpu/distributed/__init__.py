"""Beyond one device: the collectives of vLLM's device groups, Ray start-up, the
host's network interface for gloo, and weight transfer from a trainer."""
