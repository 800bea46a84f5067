"""mmengine's way: wrap a model in the DDP wrapper yourself and call ``train_step`` directly (torchrun, 2 gloo
processes).

Usage: torchrun --nproc_per_node=2 ddp_wrapper_direct.py OUT_DIR
Each rank trains on its own data; writes OUT_DIR/result_rank<r>.pt: the final weights, the
warnings ``detect_anomalous_params`` gave for a model with an unused parameter, and whether DDP
synchronised gradients at each micro-batch (through the wrapper's ``train_step``, and with
``optim_context`` around torch's own DDP in a hand-written loop).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import trainwright as tw
from trainwright.model.wrappers import MMDistributedDataParallel
from trainwright.optim import OptimWrapper

WATCHED: list[nn.Module] = []
SYNCS: list[bool] = []


class Reg(tw.BaseModel):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1)
        if unused:
            self.spare = nn.Linear(4, 1)  # never in the loss

    def forward(self, x, y=None, mode="tensor"):
        if WATCHED:
            SYNCS.append(WATCHED[0].require_backward_grad_sync)  # False inside DDP's no_sync
        out = self.linear(x)
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = Reg()
    ddp = MMDistributedDataParallel(model)
    WATCHED.append(ddp)
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for _ in range(6):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ddp.train_step((torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)), ow)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    wrapper_syncs = list(SYNCS)

    # A hand-written loop around torch's DDP, as in mmengine's optim_context docstring.
    own = Reg()
    torch_ddp = torch.nn.parallel.DistributedDataParallel(own)
    WATCHED[:] = [torch_ddp]
    SYNCS.clear()
    own_ow = OptimWrapper(torch.optim.SGD(own.parameters(), lr=0.1), accumulative_counts=2)
    for _ in range(4):
        with own_ow.optim_context(torch_ddp):
            loss = torch_ddp(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g), mode="loss")["loss"]
        own_ow.update_params(loss)
    WATCHED.clear()

    spare = Reg(unused=True)
    checked = MMDistributedDataParallel(spare, detect_anomalous_params=True, find_unused_parameters=True)
    spare_ow = OptimWrapper(torch.optim.SGD(spare.parameters(), lr=0.1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checked.train_step((torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)), spare_ow)
    messages = [str(w.message) for w in caught if "detect_anomalous_params" in str(w.message)]

    class OwnStep(Reg):  # its forwards (self(...)) would bypass a wrapper built around it
        def train_step(self, data, optim_wrapper):
            with optim_wrapper.optim_context(self):
                loss = self(*data, mode="loss")["loss"]
            optim_wrapper.update_params(loss)
            return {"loss": loss.detach()}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        own_step = MMDistributedDataParallel(OwnStep())
    own_step_warnings = [str(w.message) for w in caught]
    torch.save(
        {
            "weights": weights,
            "warnings": messages,
            "wrapper_syncs": wrapper_syncs,
            "loop_syncs": list(SYNCS),
            "own_step_warnings": own_step_warnings,
        },
        out / f"result_rank{os.environ['RANK']}.pt",
    )
    del ddp, checked, torch_ddp, own_step
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
