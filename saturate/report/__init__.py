"""Report stage: pictures of what an optimize run changed (graph drawings, an HTML page)."""
