"""Reserved for the metrics layer (see README)."""
