"""Planning a step's forward passes, one way: scheduler output -> scheduled seqs ->
prompt and decode passes -> bucket -> attention metadata (docs/architecture.md)."""
