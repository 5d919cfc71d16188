"""The data card of recorded traces (`traces/README.md`): settings, counts and acceptance, from the files.

Every number is recomputed from the Parquet files and their metadata, so the card cannot drift
from the data. `avkit datacard TRACE... [--out traces/README.md]` replaces the text
between the BEGIN/END markers of an existing card (or writes the tables alone to a new file).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from avkit.markdown import fmt, md_table
from avkit.record.stats import AcceptanceStats
from avkit.staged import staged_file
from avkit.trace.reader import check_schema, trace_metadata
from avkit.trace.schema import generations_path

COLUMNS = ["dataset", "position", "num_accepted", "accepted", "request_id", "run_id"]


def summarize(path) -> dict:
    """Metadata, row counts and acceptance statistics of one trace file (+ its generations table)."""
    path = Path(path)
    check_schema(path)  # a readable trace of format v1, else one line naming the file (trace/reader.py)
    meta = {k: v for k, v in trace_metadata(path).items() if k.startswith("avkit.")}
    table = pq.read_table(path, columns=COLUMNS)
    stats = AcceptanceStats(int(meta.get("avkit.k", "7")))
    stats.update_from_table(table)
    gens = generations_path(path)
    g = pq.read_table(gens) if gens.exists() else None
    return {
        "path": path, "meta": meta, "rows": table.num_rows, "bytes": path.stat().st_size,
        "requests": len(set(table["request_id"].cast("string").to_pylist())),
        "runs": len(set(table["run_id"].cast("string").to_pylist())),
        "generations": None if g is None else {"path": gens, "rows": g.num_rows, "bytes": gens.stat().st_size,
                                                "tokens": sum(len(x) for x in g["output_ids"].to_pylist())},
        "summary": stats.summary(),
    }


def render(info: dict) -> str:
    m = info["meta"]
    lines = [f"### `{info['path'].name}`", "",
             f"- target `{m.get('avkit.target')}` sha256 `{m.get('avkit.target_sha256')}`",
             f"- draft `{m.get('avkit.draft')}` sha256 `{m.get('avkit.draft_sha256')}`",
             (f"- K={m.get('avkit.k')}, temperature={m.get('avkit.temperature')}, top-p={m.get('avkit.top_p')}, "
              f"max_new_tokens={m.get('avkit.max_new_tokens', '?')}, dtype={m.get('avkit.dtype', 'float32')}, "
              f"policy={m.get('avkit.policy')}, drafter={m.get('avkit.drafter')}, seed={m.get('avkit.seed')}"),
             (f"- {info['rows']:,} rows (draft slots), {info['requests']} requests, {info['runs']} run(s), "
              f"{info['bytes'] / 1e6:.2f} MB")]
    if info["generations"]:
        g = info["generations"]
        lines.append(f"- generations: `{g['path'].name}`: {g['rows']} finished requests, {g['tokens']:,} tokens, "
                     f"{g['bytes'] / 1e6:.2f} MB")
    k = int(m.get("avkit.k", "7"))
    heads = ("dataset", "rows", "labelled slots", "per-slot acceptance", "tokens/step", *(f"pos {i}" for i in range(k)))
    rows = [(name, fmt(s["rows"]), fmt(s["labelled"]), fmt(s["per_slot_acceptance"], 3),
             fmt(s["tokens_per_step"], 3), *(fmt(a, 3) for a in s["acceptance_by_position"]))
            for name, s in info["summary"].items()]
    return "\n".join([*lines, "", md_table(heads, rows)]) + "\n"


BEGIN, END = "<!-- datacard:begin -->", "<!-- datacard:end -->"


def splice(card: str, tables: str) -> str:
    """Replace the generated part of a card (between the markers); append it when there are none."""
    if BEGIN in card and END in card:
        head, rest = card.split(BEGIN, 1)
        return f"{head}{BEGIN}\n{tables}{END}{rest.split(END, 1)[1]}"
    return f"{card}{BEGIN}\n{tables}{END}\n"


def write_datacard(traces, out=None) -> str:
    """The tables of every trace (a generations table is summarized with its trace, not alone); with
    `out`, spliced into that card (written atomically). -> the tables."""
    text = "\n".join(render(summarize(p)) for p in map(str, traces) if not p.endswith(".generations.parquet"))
    if out is not None:
        out = Path(out)
        card = splice(out.read_text() if out.exists() else "", text)
        with staged_file(out, "--out") as tmp:
            tmp.write_text(card)
    return text


__all__ = ["render", "splice", "summarize", "write_datacard"]
