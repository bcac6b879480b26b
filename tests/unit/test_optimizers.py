"""LARS (You et al. 2017) and LAMB (You et al. 2019) against their update rules by hand."""

from __future__ import annotations

import pytest
import torch

from labkit.train.optim import LAMB, LARS, make_optimizer

pytestmark = pytest.mark.lesson02


def _param(values: list[list[float]], grad: list[list[float]]) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.tensor(values))
    p.grad = torch.tensor(grad)
    return p


def test_lars_first_step_matches_the_formula() -> None:
    p = _param([[3.0, 4.0]], [[0.6, 0.8]])  # ||w|| = 5, ||g|| = 1
    w0, g = p.detach().clone(), p.grad.clone()
    LARS([p], lr=2.0, momentum=0.9, weight_decay=0.1, eta=0.01).step()
    local = 0.01 * 5.0 / (1.0 + 0.1 * 5.0)
    expected = w0 - 2.0 * local * (g + 0.1 * w0)
    assert torch.allclose(p.detach(), expected, atol=1e-7), (p, expected)


def test_lars_momentum_accumulates() -> None:
    p = _param([[3.0, 4.0]], [[0.6, 0.8]])
    opt = LARS([p], lr=1.0, momentum=0.5, eta=0.1)
    opt.step()
    v1 = opt.state[p]["momentum_buffer"].clone()
    w1 = p.detach().clone()
    opt.step()
    local = 0.1 * float(w1.norm()) / 1.0
    expected = w1 - (0.5 * v1 + local * p.grad)
    assert torch.allclose(p.detach(), expected, atol=1e-6)


def test_lamb_first_step_is_trust_ratio_times_unit_adam_step() -> None:
    p = _param([[3.0, 4.0]], [[0.6, -0.8]])
    w0 = p.detach().clone()
    LAMB([p], lr=0.1, eps=1e-6).step()
    u = p.grad / (p.grad.abs() + 1e-6)
    expected = w0 - 0.1 * (w0.norm() / u.norm()) * u
    assert torch.allclose(p.detach(), expected, atol=1e-6), (p, expected)


def test_biases_use_ratio_one() -> None:
    b = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    b.grad = torch.tensor([0.5, 0.5])
    LARS([b], lr=0.1, momentum=0.0).step()
    assert torch.allclose(b.detach(), torch.tensor([0.95, 1.95]))


def test_zero_weights_do_not_produce_nan() -> None:
    p = _param([[0.0, 0.0]], [[1.0, 1.0]])
    LARS([p], lr=1.0).step()
    LAMB([_param([[0.0, 0.0]], [[1.0, 1.0]])], lr=1.0).step()
    assert torch.isfinite(p).all()


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_they_reduce_a_regression_loss(name: str) -> None:
    torch.manual_seed(0)
    x, w_true = torch.randn(256, 8), torch.randn(8, 1)
    y = x @ w_true
    model = torch.nn.Linear(8, 1)
    opt = (LARS(model.parameters(), lr=1.0, eta=0.02) if name == "lars"
           else make_optimizer(name, model.parameters(), 0.05))
    first = None
    for _ in range(150):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        first = first if first is not None else loss.item()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2 * first, f"{name}: loss {first:.3f} -> {loss.item():.3f}"


def test_bad_hyperparameters_raise() -> None:
    with pytest.raises(ValueError, match="LARS needs"):
        LARS([torch.nn.Parameter(torch.ones(2))], lr=0.0)
    with pytest.raises(ValueError, match="LAMB needs"):
        LAMB([torch.nn.Parameter(torch.ones(2))], lr=0.1, betas=(1.0, 0.9))
