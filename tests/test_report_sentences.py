"""Every comparative sentence of the report follows the numbers it sits beside: swap the numbers and the
sentence turns around."""

from __future__ import annotations

import pytest

from avkit.report.sections.features import lossy_sentence
from avkit.throughput_text import gain


def _scores(lossy: tuple[float, ...], lossless: tuple[float, ...]) -> list[dict]:
    rows = [{"feature": f"lossy{i}", "estimator": "online_logistic", "scope": "all", "lossless": False, "auc": a}
            for i, a in enumerate(lossy)]
    rows += [{"feature": f"lossless{i}", "estimator": "online_logistic", "scope": "all", "lossless": True, "auc": a}
             for i, a in enumerate(lossless)]
    # other scopes never enter the comparison
    return rows + [{"feature": "lossy0", "estimator": "online_logistic", "scope": "position=0", "lossless": False,
                    "auc": 0.99}]


@pytest.mark.parametrize("lossy, lossless, verb", [
    ((0.73, 0.71), (0.91,), "rank worse than"),  # the numbers the report once sat a "rank better" beside
    ((0.91,), (0.73, 0.71), "rank better than"),  # swapped
    ((0.8, 0.5), (0.8,), "rank as well as"),
    ((0.80004,), (0.80001,), "rank as well as"),  # equal at the 4 decimals the table prints
])
def test_lossy_sentence_follows_the_aucs(lossy, lossless, verb):
    text = lossy_sentence(_scores(lossy, lossless))
    assert f"Lossy features (of q(x_sampled)) {verb} the lossless ones" in text
    assert f"best AUC {max(lossy):.4f}" in text and f"against {max(lossless):.4f}" in text


def test_no_lossy_sentence_without_both_kinds():
    assert lossy_sentence(_scores((), (0.9,))) == ""
    assert lossy_sentence(_scores((0.9,), ())) == ""


@pytest.mark.parametrize("ratio, verb", [(0.97, "it loses"), (1.03, "it gains"), (1.0002, "it neither gains nor loses")])
def test_tune_gain_follows_the_ratio(ratio, verb):
    assert gain(ratio) == f"{verb}: {ratio:.3f}x"


def test_a_roofline_simulation_is_titled_a_what_if():
    from avkit.report.sections.simulation import title

    roofline = {"spec": "roofline:H200:8b", "source": "roofline", "device": "H200", "target": "Llama-3.1-8B"}
    assert "what-if on a H200 roofline (Llama-3.1-8B target)" in title(roofline)
    measured = {"spec": "traces/cost_cpu.json", "source": "profile", "device": "cpu x86_64 x2 threads"}
    assert "what-if" not in title(measured) and "what-if" not in title(None)
