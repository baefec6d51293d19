"""Test configuration: hypothesis runs derandomized under CI, so a landing never rests on luck."""

import os

from hypothesis import HealthCheck, settings

# Locally every run explores new examples; in CI the same examples run every time, and a
# failure there reproduces on any machine with CI=true.
settings.register_profile("ci", derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("CI"):
    settings.load_profile("ci")
