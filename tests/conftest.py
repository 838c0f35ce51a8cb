"""Settings for the whole test suite."""

from hypothesis import settings

# No test depends on the wall clock: hypothesis's default 200 ms deadline per example fails a
# property on a busy machine, not on a wrong result.
settings.register_profile("llmsim", deadline=None)
settings.load_profile("llmsim")
