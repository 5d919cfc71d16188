"""Scheduling: verify policies (policy.py), the adaptive budget (plan.py with its early stop, adaptive.py), K by batch size
(batch_schedule.py) and step costs."""
