"""Start-up decisions on vLLM's config, made by the platform's config hooks in the
caller's process: what is refused (features, options, models), the user's
compilation settings, a hybrid model's state-cache settings."""
