"""DeepSpeedStrategy: ZeRO stages 1 and 2 through DeepSpeed's engine (optional extra ``trainwright[deepspeed]``).

Launch with torchrun as for DDP. The engine is built in ``setup_optim_wrapper`` from the model,
the optimizer and a config completed from the trainer's settings (keys you set win); ``backward``
and ``optimizer_step`` go through the engine. Checkpoints (``iter_8.ds``) resume at the same world
size only; DeepSpeed reads them with ``weights_only=False``. See docs/guide.md.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainwright.amp.precision import Precision
from trainwright.checkpoint.storage import local_path
from trainwright.optim.engine import ClipFn
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.registry import STRATEGIES
from trainwright.strategies.process_group import ProcessGroupStrategy

if TYPE_CHECKING:
    from trainwright.checkpoint.storage import RemotePath

_MISSING = (
    "strategy='deepspeed' needs DeepSpeed, which is not installed. Install the extra: "
    "`pip install 'trainwright[deepspeed]'` (with your torch pinned on the same command line), or use strategy='fsdp' "
    "(ZeRO-3-like sharding, "
    "built into torch) or 'ddp'."
)
_TAG = "state"  # the one tag inside each checkpoint directory


@STRATEGIES.register(name=["deepspeed", "DeepSpeedStrategy"])
class DeepSpeedStrategy(ProcessGroupStrategy):
    """DeepSpeed ZeRO (stage 1 or 2) over the processes a launcher started.

    Args:
        config: DeepSpeed config dict (``zero_optimization=dict(stage=2)``, ...); the
            trainer's accumulation, clipping and precision fill the keys it leaves out.
        device / backend / timeout_s: As for :class:`~trainwright.strategies.DDPStrategy`.

    ``prepare`` moves (and compiles) the model; the engine is built by
    :meth:`setup_optim_wrapper`, around the model and the optimizer built over it. The config
    keys left out come from the trainer: ``accumulative_counts`` → ``gradient_accumulation_steps``,
    ``clip_grad=dict(max_norm)`` → ``gradient_clipping``, ``bf16-mixed`` / ``16-mixed`` →
    ``bf16`` / ``fp16``. ``backward`` is ``engine.backward`` (window boundary set first, loss
    scaled by the wrapper) and ``optimizer_step`` is ``engine.step()``. Checkpoints are
    directories (``iter_8.ds``) that resume at the same world size; DeepSpeed reads them with
    ``weights_only=False``, so resume only from directories you wrote.

    Raises:
        ImportError: DeepSpeed is not installed (the message says how to install it).
        ValueError: the config asks for ZeRO stage 3.
    """

    name = "deepspeed"
    backward_collective = "DeepSpeed's gradient reduction (inside backward)"
    checkpoint_suffix = ".ds"
    resumable_suffixes = (".ds",)
    remote_checkpoints = False  # DeepSpeed's engine writes its own folders to local disk
    fixes_batch_size = True  # its config holds train_micro_batch_size_per_gpu
    readable_whole = False  # its folders are read by DeepSpeed's engine, on every rank

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        device: str | torch.device | None = None,
        backend: str | None = None,
        timeout_s: float = 1800.0,
    ) -> None:
        if importlib.util.find_spec("deepspeed") is None:
            raise ImportError(_MISSING)
        super().__init__(device, backend=backend, timeout_s=timeout_s)
        self.config = dict(config or {})
        stage = int(dict(self.config.get("zero_optimization", {})).get("stage", 0))
        if stage >= 3:
            raise ValueError(
                "strategy='deepspeed' supports ZeRO stages 0-2 here (parameters stay whole on every rank); for sharded "
                "parameters use strategy='fsdp'"
            )
        self.engine: Any = None

    def setup_env(
        self,
        *,
        cudnn_benchmark: bool = False,
        dist_cfg: Mapping[str, Any] | None = None,
        randomness: Mapping[str, Any] | None = None,
    ) -> None:
        """Join the process group as DDP does, then let DeepSpeed adopt it."""
        super().setup_env(cudnn_benchmark=cudnn_benchmark, dist_cfg=dist_cfg, randomness=randomness)
        import deepspeed

        deepspeed.init_distributed(dist_backend=self.backend)

    def ds_config(self, optim_wrapper: Any) -> dict[str, Any]:
        """The config handed to ``deepspeed.initialize``: the given dict, completed from the optim wrapper."""
        cfg = dict(self.config)
        cfg.setdefault("train_micro_batch_size_per_gpu", 1)
        cfg.setdefault("zero_allow_untested_optimizer", True)
        wrappers = list(optim_wrappers_of(optim_wrapper).values())
        if len(wrappers) == 1:
            ow = wrappers[0]
            cfg.setdefault("gradient_accumulation_steps", ow.accumulative_counts)
            clip = ow.clip_grad
            if clip is not None and clip["type"] != "norm":
                raise ValueError(
                    "strategy='deepspeed' clips by norm only (DeepSpeed's gradient_clipping); use "
                    "clip_grad=dict(max_norm=...)"
                )
            # DeepSpeed clips at 1.0 when its config does not say: no clip_grad must mean no clipping
            cfg.setdefault("gradient_clipping", float(clip["max_norm"]) if clip is not None else 0.0)
            for section, value in ow.precision.deepspeed_config().items():
                cfg.setdefault(section, value)
        return cfg

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Nothing yet: the engine needs the optimizer (see :meth:`setup_optim_wrapper`)."""
        return model

    def setup_optim_wrapper(self, optim_wrapper: Any) -> Any:
        """Build the DeepSpeed engine around the model and the (single) optimizer; the wrapper's updates go through
        it."""
        import deepspeed

        wrappers = list(optim_wrappers_of(optim_wrapper).values())
        if len(wrappers) != 1:
            raise ValueError(
                "strategy='deepspeed' drives one optimizer; use one optim_wrapper (param groups for different settings)"
            )
        config = self.ds_config(optim_wrapper)  # before the wrapper adopts this strategy's precision (the engine's own)
        engine, _, _, _ = deepspeed.initialize(model=self.unwrapped, optimizer=wrappers[0].optimizer, config=config)
        self.engine = self.model = engine
        self._route_forward(engine)
        return super().setup_optim_wrapper(optim_wrapper)

    def adapt_precision(self, precision: Precision) -> Precision:
        """The wrapper keeps autocast but no active GradScaler: the engine scales the loss as its config asks."""
        return precision.without_loss_scaling()

    def backward(self, loss: torch.Tensor, optim_wrapper: Any, **kwargs: Any) -> None:
        """``engine.backward`` with the accumulation boundary the wrapper decides (its loss is already scaled by the
        window)."""
        self.engine.set_gradient_accumulation_boundary(optim_wrapper.should_sync())
        self.engine.backward(loss, scale_wrt_gas=False, **kwargs)

    def clip_grad(self, clip: ClipFn, params: list[torch.Tensor]) -> torch.Tensor | None:
        """None: the engine clips inside its step (``gradient_clipping``)."""
        return None

    def optimizer_step(self, optim_wrapper: Any, **kwargs: Any) -> None:
        """``engine.step()``: reduces, clips and steps at the window's end."""
        self.engine.step(**kwargs)

    def item_scale(self, items: torch.Tensor) -> torch.Tensor:
        """Refused: the engine reduces, clips and steps the gradients in one call, so they cannot be divided by the
        window's items first."""
        raise ValueError(
            "strategy='deepspeed' cannot normalise a loss reported with num_items over its accumulation window: "
            "DeepSpeed's engine "
            "reduces, clips and steps the gradients inside engine.step(). Return the per-batch mean (loss / num_items, "
            "without "
            "num_items), or train with strategy='ddp' or 'fsdp'."
        )

    def teardown(self) -> None:
        """Drop the engine, then leave the process group."""
        self.engine = None
        super().teardown()

    # -- state: the engine's own files ----------------------------------------------------
    def optim_state_dict(self, optim_wrapper: Any) -> dict[str, Any]:
        """A description of the optimizer (its groups' sizes, for the resume check); the state itself is in the
        engine's files."""
        opt = optim_wrapper.optimizer
        return {
            "optimizer": {"param_groups": [{"params": list(range(len(g["params"])))} for g in opt.param_groups]},
            "in_engine_files": True,
        }

    def load_optim_state_dict(self, optim_wrapper: Any, state: Mapping[str, Any]) -> None:
        """Nothing to do: :meth:`load_checkpoint` had the engine load its optimizer partitions."""

    def save_checkpoint(
        self,
        path: str | Path | RemotePath,
        state: Mapping[str, Any],
        *,
        async_save: bool = False,
        after: Callable[[], None] | None = None,
    ) -> None:
        """``engine.save_checkpoint`` into a temporary directory (every rank), then rank 0 renames it onto ``path`` and
        runs ``after``.

        ``async_save`` is ignored (the write is synchronous).
        """
        from trainwright.strategies import dcp_io

        target = local_path(path, "strategy='deepspeed'")
        tmp = Path(self.broadcast_object(str(dcp_io.temp_dir(target, dcp_io.new_token()))))
        rest = dcp_io.as_cpu({k: v for k, v in state.items() if k != "model"})
        self.engine.save_checkpoint(str(tmp), tag=_TAG, client_state={"trainwright": rest})
        self.barrier()
        if self.is_main_process:
            dcp_io.publish(tmp, target)
            if after is not None:
                after()
        self.barrier()

    def load_checkpoint(self, path: str | Path | RemotePath, map_location: Any = "cpu") -> dict[str, Any]:
        """Have the engine load its module and optimizer partitions; return the trainer's state (model: the loaded
        weights).

        Raises:
            CheckpointError: the directory is not a complete DeepSpeed checkpoint.
        """
        from trainwright.checkpoint.io import CheckpointError

        p = local_path(path, "strategy='deepspeed'")
        if p.is_file():
            return super().load_checkpoint(p, map_location)
        try:
            load_path, client = self.engine.load_checkpoint(str(p), tag=_TAG)
        except (OSError, RuntimeError, ValueError, KeyError, AssertionError) as e:
            raise CheckpointError(
                f"Cannot read DeepSpeed checkpoint {str(p)!r}: {type(e).__name__}: {e}. Resume from the previous "
                "checkpoint, or check the path."
            ) from e
        if load_path is None or not isinstance(client, Mapping) or "trainwright" not in client:
            raise CheckpointError(
                f"Cannot read DeepSpeed checkpoint {str(p)!r}: it holds no trainwright state (not written by this "
                "strategy?). Resume from another checkpoint."
            )
        return {**client["trainwright"], "model": self.model_state_dict()}
