"""Running acceptance statistics of a recording, per dataset and draft position.

Glossary (docs/estimator.md):
  labelled slot   observed slot: verified and at or before the first rejection; `accepted` not null
  acceptance[i]   accepted / labelled at draft position i (the per-slot acceptance rate)
  tokens/step     emitted tokens per request-step = accepted drafts + 1 (bonus or resampled token)
Counts are kept as small integer arrays updated with np.bincount once per engine step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class _Counts:
    labelled: np.ndarray  # [K] int64
    accepted: np.ndarray  # [K] int64
    rows: int = 0
    request_steps: int = 0
    accepted_total: int = 0  # sum over request-steps of num_accepted


@dataclass
class AcceptanceStats:
    k: int
    by_dataset: dict[str, _Counts] = field(default_factory=dict)

    def _counts(self, dataset: str) -> _Counts:
        if dataset not in self.by_dataset:
            self.by_dataset[dataset] = _Counts(np.zeros(self.k, np.int64), np.zeros(self.k, np.int64))
        return self.by_dataset[dataset]

    def update(self, columns: dict) -> None:
        """Add one step's (or one file's) trace rows."""
        dataset = np.asarray(columns["dataset"], dtype=object)
        position = np.asarray(columns["position"], dtype=np.int64)
        accepted = np.ma.asarray(columns["accepted"])
        labelled = ~np.ma.getmaskarray(accepted)  # [rows] observed slots
        hit = labelled & (np.ma.getdata(accepted).astype(bool))
        # One row per (request, step) carries the step's accepted length: take position 0 rows.
        first = position == 0
        num_accepted = np.asarray(columns["num_accepted"], dtype=np.int64)
        for name in np.unique(dataset):
            sel = dataset == name
            c = self._counts(str(name))
            c.labelled += np.bincount(position[sel & labelled], minlength=self.k)[: self.k]
            c.accepted += np.bincount(position[sel & hit], minlength=self.k)[: self.k]
            c.rows += int(sel.sum())
            c.request_steps += int((sel & first).sum())
            c.accepted_total += int(num_accepted[sel & first].sum())

    def update_from_table(self, table) -> None:
        """Add the rows of a pyarrow trace table (e.g. a resumed file)."""
        if table.num_rows == 0:
            return
        acc = table["accepted"]
        self.update({
            "dataset": table["dataset"].cast("string").to_numpy(zero_copy_only=False),
            "position": table["position"].to_numpy(zero_copy_only=False),
            "num_accepted": table["num_accepted"].to_numpy(zero_copy_only=False),
            "accepted": np.ma.masked_array(acc.fill_null(False).to_numpy(zero_copy_only=False),
                                           mask=acc.is_null().to_numpy(zero_copy_only=False)),
        })

    def _sel(self, dataset: str | None) -> list[_Counts]:
        """The counts of one dataset, or of all (None)."""
        return [c for d, c in self.by_dataset.items() if dataset in (None, d)]

    def labelled(self, dataset: str | None = None) -> int:
        return int(sum(c.labelled.sum() for c in self._sel(dataset)))

    def acceptance(self, dataset: str | None = None) -> np.ndarray:
        """[K] accepted / labelled per position (nan where nothing is labelled)."""
        sel = self._sel(dataset)
        lab = sum((c.labelled for c in sel), np.zeros(self.k, np.int64))
        acc = sum((c.accepted for c in sel), np.zeros(self.k, np.int64))
        with np.errstate(invalid="ignore", divide="ignore"):
            return acc / lab

    def per_slot(self, dataset: str | None = None) -> float:
        """Accepted / labelled over all positions."""
        sel = self._sel(dataset)
        lab = sum(int(c.labelled.sum()) for c in sel)
        return sum(int(c.accepted.sum()) for c in sel) / lab if lab else float("nan")

    def tokens_per_step(self, dataset: str | None = None) -> float:
        sel = self._sel(dataset)
        steps = sum(c.request_steps for c in sel)
        return (sum(c.accepted_total for c in sel) + steps) / steps if steps else float("nan")

    def summary(self) -> dict:
        """JSON-ready table: per dataset and overall."""
        names = sorted(self.by_dataset) + [None]
        return {
            (d or "all"): {
                "rows": sum(c.rows for c in self._sel(d)),
                "labelled": self.labelled(d),
                "per_slot_acceptance": round(self.per_slot(d), 4),
                "tokens_per_step": round(self.tokens_per_step(d), 3),
                "acceptance_by_position": [round(float(a), 4) for a in self.acceptance(d)],
            }
            for d in names
        }
