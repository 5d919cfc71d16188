"""Scheduling: verify policies (policy.py), the adaptive budget (budget.py, adaptive.py), K by batch size
(batch_schedule.py) and step costs."""

from avkit.scheduling import adaptive as _adaptive  # noqa: F401  registers POLICIES["adaptive"]
from avkit.scheduling import batch_schedule as _batch_schedule  # noqa: F401  registers POLICIES["schedule"]
