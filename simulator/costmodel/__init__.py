"""Pure functions: operators -> (FLOPs, bytes) -> seconds on a device."""
