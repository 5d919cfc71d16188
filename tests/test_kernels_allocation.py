"""Survival/allocation kernel: bit-exact against the reference; the reference against brute force.

Survivals are products taken in the same order on both paths (bit-identical floats), so rankings,
ties included, and the per-request verify counts must be identical.
"""


import pytest
import torch

from avkit.errors import DataError
from avkit.kernels.allocation_ref import allocate_ref

# On CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_confidences(B, K, dtype=torch.float32, seed=0):
    """Confidences on a coarse grid (many exact ties), some exactly 1, random drafts per request."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, 5, (B, K), generator=g).float() / 4  # {0, .25, .5, .75, 1}
    return c.to(dtype), torch.randint(0, K + 1, (B,), generator=g)


def brute_force(c, num_drafted, budget):
    """Sort valid slots by (survival desc, request, position) in Python; count winners per request."""
    B = c.shape[0]
    slots = []
    for r in range(B):
        s = 1.0
        for j in range(int(num_drafted[r])):
            s = float(torch.tensor(s, dtype=torch.float32) * c[r, j].float())  # float32 product
            slots.append((-s, r, j))
    counts = [0] * B
    for _, r, _ in sorted(slots)[:budget]:
        counts[r] += 1
    return counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 5])
@pytest.mark.parametrize("K", [1, 7])
def test_triton_matches_reference_and_brute_force(kernels, K, B, dtype):
    c, nd = make_confidences(B, K, dtype, seed=B * 10 + K)
    for budget in sorted({0, 1, B * K // 2, B * K, B * K + 3}):
        want = allocate_ref(c, nd, budget)
        got = kernels.allocate(c.to(DEVICE), nd.to(DEVICE), budget)
        assert torch.equal(got.survival.cpu(), want.survival)
        assert torch.equal(got.num_verify.cpu(), want.num_verify), budget
        assert want.num_verify.tolist() == brute_force(c, nd, budget)
        assert int(want.num_verify.sum()) == min(budget, int(nd.sum()))


def test_many_requests_and_device_budget(kernels):
    from avkit.kernels.allocation import allocate_triton

    c, nd = make_confidences(37, 7, seed=3)  # 259 slots over 5 blocks of 64
    budget = torch.tensor([100])  # a budget computed on device needs no host sync
    got = allocate_triton(c.to(DEVICE), nd.to(DEVICE), budget.to(DEVICE), block_s=64)
    assert torch.equal(got.num_verify.cpu(), allocate_ref(c, nd, 100).num_verify)


def test_reference_is_the_plans_allocation():
    """With b* the plan's own, the kernel reference allocates exactly as scheduling/plan.py does."""
    from avkit.scheduling.plan import plan, single_group, verify_lookup

    c, nd = make_confidences(6, 7, seed=4)
    for slope in (0.0, 0.05, 0.3):  # verify everything, some, little
        one = torch.tensor([6])
        p = plan(c, nd, single_group(6), 1, num_sampling=one, num_scheduled=one,
                 fixed_ms=torch.tensor([1.0], dtype=torch.float64),
                 verify_ms=verify_lookup(lambda t, s=slope: 1.0 + s * t, 6 + 6 * 7 + 1))
        got = allocate_ref(c, nd, p.budget)
        assert torch.equal(got.survival, p.survival)
        assert torch.equal(got.num_verify, p.num_verify)


def test_prefixes_and_bad_input():
    c, nd = make_confidences(5, 7, seed=5)
    a = allocate_ref(c, nd, 12)
    assert bool((a.num_verify <= nd).all())
    with pytest.raises(DataError, match="confidences must be in"):
        allocate_ref(torch.tensor([[1.5]]), torch.tensor([1]), 1)
    with pytest.raises(DataError, match="num_drafted must be in"):
        allocate_ref(torch.tensor([[0.5]]), torch.tensor([2]), 1)
    with pytest.raises(DataError, match="budget must be >= 0"):
        allocate_ref(torch.tensor([[0.5]]), torch.tensor([1]), -1)
