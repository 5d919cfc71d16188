"""Trace replay: verify policies x concurrency against a cost model (replay.py), and HVD replay.

Reading order: steps.py (recorded steps as arrays, the concurrency schedule), allocate.py (the
adaptive budget vectorized over steps), online.py (estimators inside a replay), policies.py (no-spec,
fixed K, adaptive), replay.py (`simulate`, metrics, step-time check).
"""
