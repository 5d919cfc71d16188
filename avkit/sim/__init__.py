"""Trace replay (`avkit simulate`): steps.py (recorded steps, the concurrency schedule), drive.py (the engine's
policy objects over sim steps), replay.py (`simulate`, metrics)."""
