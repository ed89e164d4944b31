"""Test-wide settings: hypothesis judges properties, not speed (no per-example deadline on a shared CPU)."""

from hypothesis import settings

settings.register_profile("rollcut", deadline=None)
settings.load_profile("rollcut")
