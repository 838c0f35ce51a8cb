"""Reserved for the report layer (see README)."""
