"""Draft-confidence kernel: Triton (interpreted on CPU) vs its torch reference vs independent oracles.

Tolerances (float32 arithmetic over up to 4099 logits, different summation orders):
  logit_qmax 2e-5 abs, q_max and q_2nd 1e-6 abs, entropy 1e-5 abs, confidence 1e-6 abs,
  log_margin 2e-5 abs, -log(-log q_max) 5e-5 abs.
"""

import math

import pytest
import torch

from avkit.errors import DataError
from avkit.kernels.confidence_ref import confidence_ref

# On CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# numpy (under the interpreter) warns on log(0) = -inf, which the kernel clamps on purpose
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

ATOL = {"logit_qmax": 2e-5, "q_max": 1e-6, "q_2nd": 1e-6, "entropy": 1e-5, "confidence": 1e-6,
        "log_margin": 2e-5, "neg_log_neg_log_qmax": 5e-5}


def make_logits(B, K, V, dtype, seed=0):
    """Random logits plus the hard rows: q -> 1, -inf entries, a tie across vocabulary blocks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, K, V, generator=g) * 3.0  # [B, K, V]
    x[0, 0, V // 3] = 80.0  # q_max -> 1: 1 - q_max underflows, logit(q_max) stays exact
    if K > 1:
        x[0, 1, : V // 2] = float("-inf")  # masked vocabulary
    if B > 1:
        x[1, 0, 5] = x[1, 0, V - 2] = 30.0  # tie between the first and last block
    return x.to(dtype=dtype, device=DEVICE)


def assert_close(got, want):
    for name in got._fields:
        torch.testing.assert_close(getattr(got, name).cpu(), getattr(want, name).cpu(), atol=ATOL[name],
                                   rtol=0, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 5])
@pytest.mark.parametrize("K", [1, 7])
@pytest.mark.parametrize("V", [1000, 4099])
def test_triton_matches_reference(kernels, V, K, B, dtype):
    x = make_logits(B, K, V, dtype)
    temperature = torch.tensor([0.7, 1.0, 0.0, 2.0, 0.3], device=DEVICE)[:B]  # per request; 0 is read as 1
    args = (x, temperature, torch.arange(K, device=DEVICE), 0.55, torch.linspace(-1.0, 0.5, K, device=DEVICE))
    assert_close(kernels.confidence(*args), confidence_ref(*args))


def test_online_rescaling_across_many_blocks(kernels):
    # 9 blocks of 512: the running max moves several times, and the top ties across blocks.
    x = make_logits(5, 2, 4099, torch.float32, seed=3)
    x[2, 1, 100], x[2, 1, 4000] = 25.0, 26.0  # max found late
    from avkit.kernels.confidence import confidence_triton

    got = confidence_triton(x, 1.3, torch.tensor([0, 1], device=DEVICE), 0.5, [-0.2, 0.1], block_v=512)
    assert_close(got, confidence_ref(x, 1.3, torch.tensor([0, 1], device=DEVICE), 0.5, [-0.2, 0.1]))


@pytest.mark.parametrize("temperature", [1.0, 0.0, torch.tensor([0.5, 1.5, 1.0])])
def test_reference_matches_draft_features(temperature):
    features = pytest.importorskip("avkit.features")
    x = make_logits(3, 4, 1000, torch.float32, seed=1).cpu()
    got = confidence_ref(x, temperature, torch.arange(4), 0.5, [-0.2] * 4)
    want = features.draft_features(x, temperature)
    for name in ("logit_qmax", "q_max", "q_2nd", "entropy"):
        torch.testing.assert_close(getattr(got, name), want[name], atol=ATOL[name], rtol=0)


def test_reference_against_float64_softmax():
    x = make_logits(2, 3, 1000, torch.float32, seed=2).cpu()
    x[0, 0] = torch.randn(1000, generator=torch.Generator().manual_seed(9))  # replace the q -> 1 row
    c = confidence_ref(x, 0.8, torch.tensor([0, 1, 2]), 0.5, [-0.2, 0.0, 0.3])
    q = torch.softmax(x.double() / 0.8, -1)  # [2, 3, V]
    q_max, q_2nd = q.topk(2, -1).values.unbind(-1)
    logit = torch.log(q_max / (1 - q_max))
    entropy = -torch.xlogy(q, q).sum(-1)
    torch.testing.assert_close(c.q_max.double(), q_max, atol=1e-6, rtol=0)
    torch.testing.assert_close(c.q_2nd.double(), q_2nd, atol=1e-6, rtol=0)
    torch.testing.assert_close(c.logit_qmax.double(), logit, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(c.entropy.double(), entropy, atol=1e-5, rtol=0)
    beta = torch.tensor([-0.2, 0.0, 0.3], dtype=torch.float64)
    torch.testing.assert_close(c.confidence.double(), torch.sigmoid(0.5 * c.logit_qmax.double() + beta),
                               atol=1e-7, rtol=0)


def test_logit_exact_as_q_goes_to_one(kernels):
    # logits [30, 0, 0, ...]: 1 - q_max = (V-1) e^-30 / (...) is below float32 epsilon, yet
    # logit(q_max) = 30 - log(V - 1) exactly; naive log(q / (1 - q)) would give +inf.
    V = 1000
    x = torch.zeros(1, V, device=DEVICE)
    x[0, 0] = 30.0
    want = 30.0 - math.log(V - 1)
    for fn in (confidence_ref, kernels.confidence):
        c = fn(x, 1.0, 0, 0.5, [0.0])
        assert abs(float(c.logit_qmax[0]) - want) < 1e-5
        assert float(c.q_max[0]) == 1.0
    x[0, 0] = 200.0  # beyond the clamp
    assert float(kernels.confidence(x, 1.0, 0, 0.5, [0.0]).logit_qmax[0]) == 40.0


def test_bad_inputs_name_the_argument():
    x = torch.zeros(2, 3, 10)
    with pytest.raises(DataError, match="positions must be in"):
        confidence_ref(x, 1.0, torch.tensor([0, 1, 3]), 0.5, [0.0, 0.0, 0.0])
    with pytest.raises(DataError, match="temperature must be finite"):
        confidence_ref(x, -1.0, torch.arange(3), 0.5, [0.0] * 3)
    with pytest.raises(DataError, match="temperature shape"):
        confidence_ref(x, torch.ones(3), torch.arange(3), 0.5, [0.0] * 3)
    with pytest.raises(DataError, match="V >= 2"):
        confidence_ref(torch.zeros(2, 1), 1.0, 0, 0.5, [0.0])
