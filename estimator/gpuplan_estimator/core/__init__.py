"""Plain data every stage shares: errors, layer records, work items, options, paths."""
