"""`avkit record`: workloads -> engine -> streaming trace + generations tables."""

from avkit.record.recorder import RecordResult, record

__all__ = ["RecordResult", "record"]
