"""A model that overrides ``train_step`` (a GAN: two optimizers) trains in sync on 2 gloo processes.

Its step calls ``self(...)``, ``self.forward(...)`` and its submodules, none of which DDP's wrapper
sees: the DDP strategy averages each optim wrapper's gradients before its update. Compared with a
hand-written two-optimizer loop on one process over the concatenated global batch. In the same
launch, a model whose ranks take different branches (``find_unused_parameters=True``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from launch import gloo_group, use_gloo_env
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw

WORLD = 2
BATCH = 4  # per rank; the global batch is 8
ITERS = 4
D_ACCUM = 2  # the discriminator accumulates over 2 iterations; the generator steps every iteration, clipped


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    return TensorDataset(
        torch.randn(WORLD * BATCH * ITERS, 4, generator=g) + 1.0, torch.randn(WORLD * BATCH * ITERS, 2, generator=g)
    )


class GAN(tw.BaseModel):
    """``forward(z)`` scores generated points; ``forward(z, mode="fake")`` scores them with the generator cut off."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.generator = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 4))
        self.discriminator = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, z: torch.Tensor, mode: str = "tensor") -> torch.Tensor:
        fake = self.generator(z)
        return self.discriminator(fake.detach() if mode == "fake" else fake)

    def d_loss(self, real: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return F.softplus(-self.discriminator(real)).mean() + F.softplus(self.forward(z, mode="fake")).mean()

    def g_loss(self, z: torch.Tensor) -> torch.Tensor:
        return F.softplus(-self(z)).mean()

    def train_step(self, data, optim_wrapper):
        real, z = self.data_preprocessor(data, True)
        d, g = optim_wrapper["discriminator"], optim_wrapper["generator"]
        with d.optim_context(self):
            loss_d = self.d_loss(real, z)  # a submodule and self.forward
        d.update_params(loss_d)
        self.discriminator.requires_grad_(False)  # the generator's step with the discriminator frozen
        with g.optim_context(self):
            loss_g = self.g_loss(z)  # self(...)
        g.update_params(loss_g)
        self.discriminator.requires_grad_(True)
        return {"loss_d": loss_d.detach(), "loss_g": loss_g.detach()}


def _routed_data() -> TensorDataset:
    """Even samples have x[0] > 0, odd ones x[0] < 0: sharded over 2 ranks, rank 0 sees only the first kind, rank 1
    the second."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(WORLD * BATCH * ITERS, 4, generator=g)
    x[:, 0] = x[:, 0].abs() + 0.1
    x[1::2, 0] *= -1
    return TensorDataset(x, torch.randn(WORLD * BATCH * ITERS, 1, generator=g))


class Routed(tw.BaseModel):
    """Samples with x[0] > 0 go through ``a``, the others through ``b``; ``spare`` is never used."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.a, self.b, self.spare = nn.Linear(4, 1), nn.Linear(4, 1), nn.Linear(4, 1)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        pos = x[:, 0] > 0
        errors = [
            layer(x[rows]) - y[rows] for layer, rows in ((self.a, pos), (self.b, ~pos)) if rows.any()
        ]  # a branch without rows is not called
        return torch.cat(errors).pow(2).sum() / len(x)

    def train_step(self, data, optim_wrapper):
        x, y = self.data_preprocessor(data, True)
        with optim_wrapper.optim_context(self):
            loss = self.loss(x, y)
        optim_wrapper.update_params(loss)
        return {"loss": loss.detach()}


ROUTED_OPTIM = dict(type="AdamW", lr=0.05, weight_decay=0.1)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    with gloo_group(rank, init_file, WORLD):
        model = GAN()
        if rank == 1:  # a different start on rank 1: the strategy must give every rank rank 0's weights
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
        t = tw.Trainer(
            model=model,
            work_dir=Path(out_dir) / f"rank{rank}",
            train_dataloader=DataLoader(_data(), batch_size=BATCH),
            optim_wrapper=dict(
                generator=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9), clip_grad=dict(max_norm=0.05)),
                discriminator=dict(optimizer=dict(type="Adam", lr=0.01), accumulative_counts=D_ACCUM),
            ),
            train_cfg=dict(by_epoch=False, max_iters=ITERS),
            strategy="ddp",
            default_hooks=dict(checkpoint=None, logger=None),
            log_level="WARNING",
        )
        t.train()
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, Path(out_dir) / f"rank{rank}.pt")
        t.close()
        del t  # nothing of the run outlives the process group
        # a parameter with a gradient on one rank only (each rank takes one branch), and one no rank uses
        routed = Routed()
        t = tw.Trainer(
            model=routed,
            work_dir=Path(out_dir) / f"routed{rank}",
            train_dataloader=DataLoader(_routed_data(), batch_size=BATCH),
            optim_wrapper=dict(optimizer=ROUTED_OPTIM),
            train_cfg=dict(by_epoch=False, max_iters=ITERS),
            strategy=dict(type="ddp", find_unused_parameters=True),
            default_hooks=dict(checkpoint=None, logger=None),
            log_level="WARNING",
        )
        t.train()
        torch.save({k: v.detach().clone() for k, v in routed.state_dict().items()}, Path(out_dir) / f"routed{rank}.pt")
        t.close()
        del t
        # without find_unused_parameters the first update finds the branches differ, on every rank, and names the fix
        t = tw.Trainer(
            model=Routed(),
            work_dir=Path(out_dir) / f"unflagged{rank}",
            train_dataloader=DataLoader(_routed_data(), batch_size=BATCH),
            optim_wrapper=dict(optimizer=ROUTED_OPTIM),
            train_cfg=dict(by_epoch=False, max_iters=ITERS),
            strategy="ddp",
            default_hooks=dict(checkpoint=None, logger=None),
            log_level="CRITICAL",
        )
        try:
            t.train()
            error = ""
        except RuntimeError as e:
            error = str(e)
        t.close()
        del t
        (Path(out_dir) / f"unflagged{rank}.txt").write_text(error)


def _reference() -> dict[str, torch.Tensor]:
    """The same steps by hand on one process, each iteration on the global batch (both ranks' shards together)."""
    model = GAN()
    data = _data()
    opt_d = torch.optim.Adam(model.discriminator.parameters(), lr=0.01)
    opt_g = torch.optim.SGD(model.generator.parameters(), lr=0.05, momentum=0.9)
    n = WORLD * BATCH
    for it in range(ITERS):
        real, z = data.tensors[0][it * n : (it + 1) * n], data.tensors[1][it * n : (it + 1) * n]
        (model.d_loss(real, z) / D_ACCUM).backward()
        if (it + 1) % D_ACCUM == 0:
            opt_d.step()
            opt_d.zero_grad()
        model.discriminator.requires_grad_(False)
        model.g_loss(z).backward()
        torch.nn.utils.clip_grad_norm_(model.generator.parameters(), 0.05)
        opt_g.step()
        opt_g.zero_grad()
        model.discriminator.requires_grad_(True)
    return {k: v.detach() for k, v in model.state_dict().items()}


def _routed_reference() -> dict[str, torch.Tensor]:
    model = Routed()
    x, y = _routed_data().tensors
    opt = torch.optim.AdamW(model.parameters(), **{k: v for k, v in ROUTED_OPTIM.items() if k != "type"})
    n = WORLD * BATCH
    for it in range(ITERS):
        model.loss(x[it * n : (it + 1) * n], y[it * n : (it + 1) * n]).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_gan_overriding_train_step_stays_in_sync_and_equals_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_gloo_env(monkeypatch, tmp_path)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD))
    ref = _reference()
    assert set(r0) == set(ref)
    start = GAN().state_dict()
    for k, v in ref.items():
        assert torch.equal(r0[k], r1[k]), f"{k}: the ranks' weights differ"
        assert not torch.equal(v, start[k]), f"{k} did not train"
        # 2 ranks' mean gradients averaged vs one mean over the 8 samples: float rounding only
        torch.testing.assert_close(
            r0[k],
            v,
            atol=1e-6,
            rtol=0,
            msg=lambda m, k=k: f"{k} differs from the one-process loop on the global batch: {m}",
        )
    # find_unused_parameters=True: a branch taken on one rank only averages with the other rank's zeros; the unused
    # layer is untouched
    r0, r1 = (torch.load(tmp_path / f"routed{r}.pt", weights_only=True) for r in range(WORLD))
    ref, start = _routed_reference(), Routed().state_dict()
    for k, v in ref.items():
        assert torch.equal(r0[k], r1[k]), f"{k}: the ranks' weights differ"
        assert torch.equal(v, start[k]) == k.startswith("spare."), (
            k
        )  # AdamW's weight decay would move a zero-gradient 'spare'
        torch.testing.assert_close(
            r0[k],
            v,
            atol=1e-6,
            rtol=0,
            msg=lambda m, k=k: f"{k} differs from the one-process loop on the global batch: {m}",
        )
    for r in range(WORLD):
        error = (tmp_path / f"unflagged{r}.txt").read_text()
        assert "have a gradient on some processes only" in error and "find_unused_parameters=True" in error, error
        assert "'a.weight'" in error and "'b.weight'" in error and "spare" not in error, error
