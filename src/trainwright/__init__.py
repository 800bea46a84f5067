"""trainwright: a PyTorch training engine.

Quick start::

    import trainwright as tw
    trainer = tw.Trainer(model=net, train_dataloader=loader, optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
                         train_cfg=dict(by_epoch=True, max_epochs=10))
    trainer.train()
"""

from trainwright import evaluation
from trainwright.hooks import Hook
from trainwright.model import BaseModel
from trainwright.optim import AmpOptimWrapper, OptimWrapper, OptimWrapperDict
from trainwright.trainer import Trainer
from trainwright.utils.seed import set_random_seed as seed_everything
from trainwright.version import __version__

__all__ = ["Trainer", "BaseModel", "Hook", "OptimWrapper", "AmpOptimWrapper", "OptimWrapperDict", "evaluation", "seed_everything", "__version__"]
