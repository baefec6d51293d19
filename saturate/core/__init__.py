"""Core: the graph IR, errors, window geometry and atomic file writes that every stage shares."""
