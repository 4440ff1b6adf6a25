"""The outcome of a tune on disk: report, renderers, checkpoint, and the writer that commits them as a set."""
