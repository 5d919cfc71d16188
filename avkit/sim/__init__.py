"""Trace replay: verify policies x concurrency against a cost model (replay.py), and HVD replay.

Reading order: steps.py (recorded steps as arrays, the concurrency schedule), drive.py (the engine's
own policy objects over a group vector of sim steps, what each step costs), online.py (estimator
burn-in), replay.py (`simulate`, metrics, step-time check).
"""
