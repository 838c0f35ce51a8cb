"""`python -m simulator.calibrate [--device ID ...] [--check]`: see the package docstring."""

from simulator.calibrate.script import main

if __name__ == "__main__":
    raise SystemExit(main())
