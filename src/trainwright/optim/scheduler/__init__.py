"""Parameter schedulers (learning rate, momentum, any param-group key), mmengine-style.

Each scheduler is registered in ``trainwright.registry.PARAM_SCHEDULERS``; its module loads at the first lookup of its
name (or the first use of its name here).
See ``docs/schedulers.md`` for windows (``begin``/``end``), units (``by_epoch``,
``by_update``), chaining, ``convert_to_iter_based`` and torch's schedulers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainwright.optim.scheduler.base import INF, OptimizerLike, ParamScheduler
from trainwright.optim.scheduler.builder import build_param_scheduler, build_param_schedulers
from trainwright.utils.lazy import lazy_names

if TYPE_CHECKING:
    from trainwright.optim.scheduler.cosine_restart import CosineRestartParamScheduler
    from trainwright.optim.scheduler.lambda_scheduler import LambdaLR, LambdaParamScheduler
    from trainwright.optim.scheduler.lr_scheduler import (
        ConstantLR,
        CosineAnnealingLR,
        CosineRestartLR,
        ExponentialLR,
        LinearLR,
        LRSchedulerMixin,
        MultiStepLR,
        OneCycleLR,
        PolyLR,
        ReduceOnPlateauLR,
        StepLR,
    )
    from trainwright.optim.scheduler.momentum_scheduler import (
        ConstantMomentum,
        CosineAnnealingMomentum,
        CosineRestartMomentum,
        ExponentialMomentum,
        LinearMomentum,
        MomentumSchedulerMixin,
        MultiStepMomentum,
        PolyMomentum,
        ReduceOnPlateauMomentum,
        StepMomentum,
    )
    from trainwright.optim.scheduler.one_cycle import OneCycleParamScheduler
    from trainwright.optim.scheduler.param_scheduler import (
        ConstantParamScheduler,
        CosineAnnealingParamScheduler,
        ExponentialParamScheduler,
        LinearParamScheduler,
        MultiStepParamScheduler,
        PolyParamScheduler,
        StepParamScheduler,
    )
    from trainwright.optim.scheduler.plateau import ReduceOnPlateauParamScheduler
    from trainwright.optim.scheduler.torch_scheduler import TorchScheduler

#: Loaded on first use (PEP 562): a run keeps only the code it uses.
__getattr__, __dir__ = lazy_names(__name__, __file__, globals())

__all__ = [
    "INF",
    "OptimizerLike",
    "ParamScheduler",
    "build_param_scheduler",
    "build_param_schedulers",
    "ConstantParamScheduler",
    "LinearParamScheduler",
    "StepParamScheduler",
    "MultiStepParamScheduler",
    "ExponentialParamScheduler",
    "CosineAnnealingParamScheduler",
    "PolyParamScheduler",
    "OneCycleParamScheduler",
    "CosineRestartParamScheduler",
    "ReduceOnPlateauParamScheduler",
    "LambdaParamScheduler",
    "TorchScheduler",
    "LRSchedulerMixin",
    "ConstantLR",
    "LinearLR",
    "StepLR",
    "MultiStepLR",
    "ExponentialLR",
    "CosineAnnealingLR",
    "PolyLR",
    "OneCycleLR",
    "CosineRestartLR",
    "ReduceOnPlateauLR",
    "LambdaLR",
    "MomentumSchedulerMixin",
    "ConstantMomentum",
    "LinearMomentum",
    "StepMomentum",
    "MultiStepMomentum",
    "ExponentialMomentum",
    "CosineAnnealingMomentum",
    "PolyMomentum",
    "CosineRestartMomentum",
    "ReduceOnPlateauMomentum",
]
