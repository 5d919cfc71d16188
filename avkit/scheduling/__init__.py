"""Scheduling: verify policies (policy.py), the adaptive budget (budget.py, adaptive.py) and step costs."""
