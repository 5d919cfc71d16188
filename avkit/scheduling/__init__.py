"""Scheduling: verify policies (policy.py), the adaptive budget (plan.py, stop.py, adaptive.py), K by batch size
(batch_schedule.py) and step costs."""
