"""Scheduling: verify policies (policy.py), the adaptive budget (budget.py, adaptive.py) and step costs."""

from avkit.scheduling import adaptive as _adaptive  # noqa: F401  registers POLICIES["adaptive"]
