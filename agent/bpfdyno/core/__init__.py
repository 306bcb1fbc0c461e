"""What every part shares: the metric catalog, the store, status, errors, config, events."""
