"""Running acceptance statistics of a recording, per dataset and draft position.

Glossary (docs/estimator.md):
  labelled slot   observed slot: verified and at or before the first rejection; `accepted` not null
  acceptance[i]   accepted / labelled at draft position i (the per-slot acceptance rate)
  tokens/step     emitted tokens per request-step = accepted drafts + 1 (bonus or resampled token)
Counts are one int64 vector per dataset, updated with np.bincount once per engine step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class AcceptanceStats:
    k: int
    # dataset -> [2K + 3] int64: labelled per position [K], accepted per position [K], then rows,
    # request-steps and the sum over request-steps of num_accepted
    by_dataset: dict[str, np.ndarray] = field(default_factory=dict)

    def update(self, columns: dict) -> None:
        """Add one step's (or one file's) trace rows."""
        k = self.k
        dataset = np.asarray(columns["dataset"], dtype=object)
        position = np.asarray(columns["position"], dtype=np.int64)
        accepted = np.ma.asarray(columns["accepted"])
        labelled = ~np.ma.getmaskarray(accepted)  # [rows] observed slots
        hit = labelled & (np.ma.getdata(accepted).astype(bool))
        first = position == 0  # one row per (request, step) carries the step's accepted length
        num_accepted = np.asarray(columns["num_accepted"], dtype=np.int64)
        for name in np.unique(dataset):
            sel = dataset == name
            c = self.by_dataset.setdefault(str(name), np.zeros(2 * k + 3, np.int64))
            c[:k] += np.bincount(position[sel & labelled], minlength=k)[:k]
            c[k:2 * k] += np.bincount(position[sel & hit], minlength=k)[:k]
            c[2 * k:] += (sel.sum(), (sel & first).sum(), num_accepted[sel & first].sum())

    def update_from_table(self, table) -> None:
        """Add the rows of a pyarrow trace table (e.g. a resumed file)."""
        acc = table["accepted"]
        arrays = {c: table[c].to_numpy(zero_copy_only=False) for c in ("position", "num_accepted")}
        self.update({**arrays, "dataset": table["dataset"].cast("string").to_numpy(zero_copy_only=False),
                     "accepted": np.ma.masked_array(acc.fill_null(False).to_numpy(zero_copy_only=False),
                                                    mask=acc.is_null().to_numpy(zero_copy_only=False))})

    def _total(self, dataset: str | None) -> np.ndarray:
        """[2K + 3] counts of one dataset, or of all (None)."""
        return sum((c for d, c in self.by_dataset.items() if dataset in (None, d)), np.zeros(2 * self.k + 3, np.int64))

    def labelled(self, dataset: str | None = None) -> int:
        return int(self._total(dataset)[:self.k].sum())

    def acceptance(self, dataset: str | None = None) -> np.ndarray:
        """[K] accepted / labelled per position (nan where nothing is labelled)."""
        c = self._total(dataset)
        with np.errstate(invalid="ignore", divide="ignore"):
            return c[self.k:2 * self.k] / c[:self.k]

    def per_slot(self, dataset: str | None = None) -> float:
        """Accepted / labelled over all positions."""
        c, k = self._total(dataset), self.k
        return int(c[k:2 * k].sum()) / int(c[:k].sum()) if c[:k].any() else float("nan")

    def tokens_per_step(self, dataset: str | None = None) -> float:
        steps, accepted = self._total(dataset)[2 * self.k + 1:]
        return float(accepted + steps) / steps if steps else float("nan")

    def summary(self) -> dict:
        """JSON-ready table: per dataset and overall."""
        return {(d or "all"): {"rows": int(self._total(d)[2 * self.k]), "labelled": self.labelled(d),
                               "per_slot_acceptance": round(self.per_slot(d), 4),
                               "tokens_per_step": round(self.tokens_per_step(d), 3),
                               "acceptance_by_position": [round(float(a), 4) for a in self.acceptance(d)]}
                for d in [*sorted(self.by_dataset), None]}
