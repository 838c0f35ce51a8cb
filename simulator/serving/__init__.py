"""Reserved for the serving layer (see README)."""
