"""Before serving: execution mode, memory split, bucket warmup, graph capture
budget, graph splits between layers."""
