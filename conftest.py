"""Settings for the whole test run."""

from hypothesis import HealthCheck, settings

# CI machines are small and shared: no per-example deadline, no too-slow health check.
settings.register_profile("trident", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("trident")
