"""Core: the graph IR, errors, op facts and atomic file writes that every stage shares."""
