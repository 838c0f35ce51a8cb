"""Settings for the whole test suite."""

import pytest
from hypothesis import settings

# No test depends on the wall clock: hypothesis's default 200 ms deadline per example fails a
# property on a busy machine, not on a wrong result.
settings.register_profile("llmsim", deadline=None)
settings.load_profile("llmsim")


# The modules whose tests run the validation suites. The suites are simulated once per process
# (`simulator.validate` caches them), so under pytest-xdist (`make test`: `--dist loadgroup`)
# these modules share one worker, which simulates them once, instead of each worker again.
SUITE_MODULES = {
    "test_validate.py",
    "test_e2e_suite.py",
    "test_energy_suite.py",
    "test_serving_curve_suite.py",
    "test_targets.py",
    "test_bands_fit.py",
}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups from the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SUITE_MODULES and item.path.parent.name == "validate":
            item.add_marker(pytest.mark.xdist_group("validation-suites"))
