"""Trainer.from_config: registries, mmengine-style configs, unknown keys, errors naming the config path."""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trainwright as tw
from trainwright.config import Config, ConfigError
from trainwright.registry import DATASETS, MODELS, Registry

COMPONENTS = """
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw
from trainwright.registry import DATASETS, MODELS


@MODELS.register()
class TinyBackbone(nn.Module):
    def __init__(self, in_channels=8, width=16):
        super().__init__()
        self.fc = nn.Linear(in_channels, width)

    def forward(self, x):
        return torch.relu(self.fc(x))


@MODELS.register()
class TinyClassifier(tw.BaseModel):
    def __init__(self, backbone, num_classes=3, data_preprocessor=None):
        super().__init__(data_preprocessor=data_preprocessor)
        self.backbone = MODELS.build(backbone)
        self.head = nn.Linear(self.backbone.fc.out_features, num_classes)

    def forward(self, x, y=None, mode="tensor"):
        if isinstance(x, (list, tuple)):  # mmengine's pseudo_collate: a list of samples (an mmengine data preprocessor stacks them)
            SEEN_BATCH_TYPES.add("pseudo")
            x, y = torch.stack(list(x)), None if y is None else torch.stack(list(y))
        else:
            SEEN_BATCH_TYPES.add("stacked")
        logits = self.head(self.backbone(x))
        return {"loss": F.cross_entropy(logits, y)} if mode == "loss" else logits


SEEN_BATCH_TYPES = set()


@DATASETS.register()
class ToyBlobs(TensorDataset):
    def __init__(self, n=96, dim=8, classes=3, seed=0):
        g = torch.Generator().manual_seed(seed)
        y = torch.randint(0, classes, (n,), generator=g)
        x = torch.randn(n, dim, generator=g) * 0.3 + torch.nn.functional.one_hot(y, dim).float() * 3
        super().__init__(x, y)
"""

#: An mmengine / mmpretrain-style config split as OpenMMLab splits it; loaded unchanged.
MM_BASE_MODEL = """
model = dict(
    type='TinyClassifier',
    backbone=dict(type='TinyBackbone', in_channels=8, width=16),
    num_classes=3,
)
"""
MM_BASE_DATA = """
dataset_cfg = None  # placeholder overwritten below: mmengine configs also hold plain values
train_dataloader = dict(
    batch_size=16,
    num_workers=0,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='ToyBlobs', n=96, seed=0),
)
val_dataloader = dict(
    batch_size=32,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='ToyBlobs', n=48, seed=1),
)
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
""".replace("dataset_cfg = None  # placeholder overwritten below: mmengine configs also hold plain values\n", "")
MM_BASE_SCHEDULE = """
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=0.0001))
param_scheduler = dict(type='MultiStepLR', by_epoch=True, milestones=[2], gamma=0.1)
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=3, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
"""
MM_BASE_RUNTIME = """
default_scope = 'mmpretrain'
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=2),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', interval=1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
)
env_cfg = dict(cudnn_benchmark=False, mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0), dist_cfg=dict(backend='nccl'))
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0, deterministic=False)
"""
MM_CONFIG = """
_base_ = [
    '../_base_/models/tiny.py',
    '../_base_/datasets/toy_blobs.py',
    '../_base_/schedules/toy_sgd.py',
    '../_base_/default_runtime.py',
]
custom_imports = dict(imports=['{module}'], allow_failed_imports=False)
model = dict(backbone=dict(width=32))
optim_wrapper = dict(optimizer=dict(lr=0.05))
work_dir = '{work_dir}'
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture
def components(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module registering the test's model and dataset, importable by name (as a user's package would be)."""
    name = "tw_test_components"
    _write(tmp_path / "pkg" / f"{name}.py", COMPONENTS)
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    import importlib

    importlib.invalidate_caches()
    return name


def _mm_config(tmp_path: Path, module: str) -> Path:
    _write(tmp_path / "configs/_base_/models/tiny.py", MM_BASE_MODEL)
    _write(tmp_path / "configs/_base_/datasets/toy_blobs.py", MM_BASE_DATA)
    _write(tmp_path / "configs/_base_/schedules/toy_sgd.py", MM_BASE_SCHEDULE)
    _write(tmp_path / "configs/_base_/default_runtime.py", MM_BASE_RUNTIME)
    return _write(
        tmp_path / "configs/tiny/tiny_8xb16_toy.py",
        MM_CONFIG.format(module=module, work_dir=(tmp_path / "work").as_posix()),
    )


def test_mmengine_style_config_loads_and_trains(tmp_path: Path, components: str) -> None:
    cfg = Config.fromfile(_mm_config(tmp_path, components))
    assert cfg.model.backbone.to_dict() == {"type": "TinyBackbone", "in_channels": 8, "width": 32}
    assert cfg.optim_wrapper.optimizer.momentum == 0.9 and cfg.optim_wrapper.optimizer.lr == 0.05
    with pytest.warns(UserWarning, match="default_scope.*ignored"):
        trainer = tw.Trainer.from_config(cfg, experiment_name="run")
    try:
        assert type(trainer.unwrapped_model).__name__ == "TinyClassifier"
        assert trainer.unwrapped_model.backbone.fc.out_features == 32
        trainer.train()
        assert trainer.progress.epoch == 3
        assert trainer.val()["val/acc"] > 0.9
        # train_dataloader names default_collate; val_dataloader names none: mmengine's default, pseudo_collate
        assert __import__(components).SEEN_BATCH_TYPES == {"stacked", "pseudo"}
        assert trainer.optim_wrapper.optimizer.param_groups[0]["lr"] == pytest.approx(0.005)  # MultiStepLR at epoch 2
        dumped = Config.fromfile(tmp_path / "work" / "run" / "config.py")
        assert dumped.model.backbone.width == 32 and "_base_" not in dumped
    finally:
        trainer.close()


def test_mmengine_visualizer_backends_become_writers(tmp_path: Path, components: str) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = _mm_config(tmp_path, components)
    text = path.read_text() + (
        "vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]\n"
        "visualizer = dict(type='UniversalVisualizer', vis_backends=vis_backends, name='visualizer')\n"
        "train_cfg = dict(max_epochs=1)\n"
        "env_cfg = dict(cudnn_benchmark=True, mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0), "
        "dist_cfg=dict(backend='nccl'))\n"
    )
    path.write_text(text)
    benchmark_before = torch.backends.cudnn.benchmark
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = tw.Trainer.from_config(Config.fromfile(path), experiment_name="vis")
    try:
        assert torch.backends.cudnn.benchmark is True  # env_cfg honoured, as mmengine's Runner does
        assert [type(w).__name__ for w in trainer.writers] == ["ConsoleWriter", "JsonlWriter", "TensorBoardWriter"]
        trainer.train()
    finally:
        trainer.close()
        torch.backends.cudnn.benchmark = benchmark_before
    acc = EventAccumulator(str(trainer.run_dir / "tensorboard"))
    acc.Reload()
    assert "train/loss" in acc.Tags()["scalars"] and "val/acc" in acc.Tags()["scalars"]
    assert (trainer.run_dir / "metrics.jsonl").is_file()


class _MseModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.fc(x), y)


@pytest.mark.parametrize(
    ("enable", "world", "lr"), [(True, "1", 0.1 * 16 / 64), (True, "2", 0.1 * 32 / 64), (False, "1", 0.1)]
)
def test_auto_scale_lr_scales_by_the_real_batch_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enable: bool, world: str, lr: float
) -> None:
    # as if the launcher had started `world` processes (this one trains alone: strategy="single" joins no process group)
    monkeypatch.setattr(tw.dist, "launched_world_size", lambda: int(world))
    data = torch.utils.data.TensorDataset(torch.randn(32, 2), torch.randn(32, 1))
    cfg = dict(
        model=_MseModel(),
        work_dir=str(tmp_path),
        strategy="single",
        train_dataloader=dict(dataset=data, batch_size=16),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        auto_scale_lr=dict(enable=enable, base_batch_size=64),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # translated, not "ignored with a warning"
        trainer = tw.Trainer.from_config(cfg)
    try:
        trainer.train()
        assert trainer.optim_wrapper.optimizer.param_groups[0]["lr"] == pytest.approx(lr)
    finally:
        trainer.close()
    with pytest.raises(ConfigError, match="base_batch_size must be a positive int"):
        tw.Trainer.from_config({**cfg, "auto_scale_lr": dict(enable=True)})


def test_unknown_visualizer_backend_is_refused_by_name(tmp_path: Path) -> None:
    cfg = dict(
        model=nn.Linear(2, 1), work_dir=str(tmp_path), visualizer=dict(vis_backends=[dict(type="ClearMLVisBackend")])
    )
    with pytest.raises(ConfigError, match=r"vis_backends\[0\]: 'ClearMLVisBackend' is not a visualizer backend"):
        tw.Trainer.from_config(cfg)
    cfg = dict(model=nn.Linear(2, 1), work_dir=str(tmp_path), vis_backends=[dict(type="WandbVisBackend", commit=True)])
    with pytest.raises(ConfigError, match=r"no counterpart of \['commit'\]"):
        tw.Trainer.from_config(cfg)


def test_collate_fn_configs_build_mmengine_functions(tmp_path: Path) -> None:
    from trainwright.data.collate import pseudo_collate

    data = torch.utils.data.TensorDataset(torch.arange(6.0).view(3, 2), torch.arange(3))
    built = {}
    for name, loader in [
        ("mm_default", dict(dataset=data, batch_size=3, sampler=dict(type="DefaultSampler", shuffle=False))),
        ("named", dict(dataset=data, batch_size=3, collate_fn=dict(type="pseudo_collate"))),
        ("plain", dict(dataset=data, batch_size=3)),
    ]:
        trainer = tw.Trainer.from_config(
            dict(model=nn.Linear(2, 1), work_dir=str(tmp_path / name), val_dataloader=loader)
        )
        try:
            built[name] = next(iter(trainer.val_loop.dataloader))
        finally:
            trainer.close()
    for name in ("mm_default", "named"):
        xs, ys = built[name]
        assert (
            isinstance(xs, tuple)
            and len(xs) == 3
            and torch.equal(xs[2], torch.tensor([4.0, 5.0]))
            and [int(y) for y in ys] == [0, 1, 2]
        )
    assert torch.equal(built["plain"][0], torch.arange(6.0).view(3, 2))  # a plain dict keeps torch's default_collate
    assert pseudo_collate([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]) == {"a": [1, 2], "b": ["x", "y"]}
    with pytest.raises(ConfigError, match="pseudo_colate"):
        tw.Trainer.from_config(
            dict(
                model=nn.Linear(2, 1),
                work_dir=str(tmp_path / "bad"),
                val_dataloader=dict(dataset=data, collate_fn=dict(type="pseudo_colate")),
            )
        )


class _StackedOnly(tw.BaseModel):
    """A model written for stacked tensors (torch's default_collate), as most plain PyTorch models are."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 3)

    def forward(self, x, y=None, mode="tensor"):
        out = self.fc(x)
        return {"loss": F.cross_entropy(out, y)} if mode == "loss" else out


def test_a_model_given_pseudo_collate_lists_is_told_why_and_what_to_change(tmp_path: Path) -> None:
    """mmengine's Runner collates an mmengine-style dataloader with pseudo_collate (so does trainwright); a model that
    expects
    tensors fails inside torch with a TypeError about a tuple. The error and the log's last line name the cause and
    the fix."""
    data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randint(0, 3, (8,)))
    loader = dict(dataset=data, batch_size=4, sampler=dict(type="DefaultSampler", shuffle=True))
    cfg = dict(
        model=_StackedOnly(),
        work_dir=str(tmp_path / "mm"),
        train_dataloader=loader,
        train_cfg=dict(by_epoch=True, max_epochs=1),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
    )
    trainer = tw.Trainer.from_config(cfg)
    with pytest.raises(TypeError, match="not tuple") as info:
        trainer.train()
    fix = "collate_fn=dict(type='default_collate')"
    last = (trainer.run_dir / "train.log").read_text().splitlines()[-1]
    trainer.close()
    assert "Stopped by TypeError" in last and "pseudo_collate" in last and fix in last, last
    if sys.version_info >= (3, 11):
        assert any(fix in note for note in info.value.__notes__)
    # the fix it names trains
    trainer = tw.Trainer.from_config(
        {
            **cfg,
            "work_dir": str(tmp_path / "fixed"),
            "train_dataloader": {**loader, "collate_fn": dict(type="default_collate")},
        }
    )
    trainer.train()
    assert trainer.progress.iteration == 2
    trainer.close()
    # a plain dataloader (torch's default_collate) gets no such hint for a TypeError of its own
    trainer = tw.Trainer.from_config(
        {
            **cfg,
            "work_dir": str(tmp_path / "plain"),
            "train_dataloader": dict(dataset=[([1.0, 2.0], 0)] * 4, batch_size=2),
        }
    )
    with pytest.raises(TypeError):
        trainer.train()
    last = (trainer.run_dir / "train.log").read_text().splitlines()[-1]
    trainer.close()
    assert "Stopped by TypeError" in last and "pseudo_collate" not in last, last


def test_unknown_top_level_key_has_close_match(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Unknown top-level config key 'optim_wraper'. Did you mean 'optim_wrapper'"):
        tw.Trainer.from_config(dict(model=nn.Linear(2, 1), optim_wraper=dict()))
    # helper variables of .py configs: a leading underscore keeps them out
    trainer = tw.Trainer.from_config(dict(model=nn.Linear(2, 1), _helper=1, work_dir=str(tmp_path)))
    trainer.close()
    with pytest.raises(ConfigError, match="no 'model'"):
        tw.Trainer.from_config(dict(work_dir=str(tmp_path)))


def test_unknown_type_names_close_matches_and_how_to_register(components: str, tmp_path: Path) -> None:
    __import__(components)
    with pytest.raises(
        ConfigError,
        match=r"Building 'model' .*Unknown model type 'TinyClasifier'. Did you mean "
        r"'TinyClassifier'.*@trainwright.registry.MODELS.register\(\)",
    ):
        tw.Trainer.from_config(
            dict(model=dict(type="TinyClasifier", backbone=dict(type="TinyBackbone")), work_dir=str(tmp_path))
        )


def test_nested_failure_names_its_config_path(components: str, tmp_path: Path) -> None:
    __import__(components)
    with pytest.raises(
        ConfigError, match=r"Building 'model.backbone' from the config failed: Unknown model type 'TinyBackbon'"
    ) as info:
        tw.Trainer.from_config(
            dict(model=dict(type="TinyClassifier", backbone=dict(type="TinyBackbon")), work_dir=str(tmp_path))
        )
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(
        ConfigError,
        match=r"Building 'model.backbone' .*TypeError: Could not build model 'TinyBackbone'.*unexpected keyword argument "
        r"'widht'",
    ):
        tw.Trainer.from_config(
            dict(model=dict(type="TinyClassifier", backbone=dict(type="TinyBackbone", widht=3)), work_dir=str(tmp_path))
        )
    with pytest.raises(ConfigError, match=r"Building 'train_dataloader.dataset' .*unexpected keyword argument 'size'"):
        tw.Trainer.from_config(
            dict(
                model=dict(type="TinyClassifier", backbone=dict(type="TinyBackbone")),
                train_dataloader=dict(dataset=dict(type="ToyBlobs", size=3)),
                work_dir=str(tmp_path),
            )
        )
    with pytest.raises(
        ConfigError, match=r"Building 'custom_hooks.0' .*Unknown hook type 'EMAHok'. Did you mean 'EMAHook'"
    ):
        tw.Trainer.from_config(dict(model=nn.Linear(2, 1), custom_hooks=[dict(type="EMAHok")], work_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"Building 'val_evaluator' .*Did you mean 'Accuracy'"):
        tw.Trainer.from_config(
            dict(
                model=nn.Linear(2, 1),
                val_dataloader=[(torch.zeros(1, 2),)],
                val_evaluator=dict(type="Acuracy"),
                work_dir=str(tmp_path),
            )
        )


def test_model_is_seeded_from_randomness(components: str, tmp_path: Path) -> None:
    __import__(components)
    cfg = dict(
        model=dict(type="TinyClassifier", backbone=dict(type="TinyBackbone")),
        randomness=dict(seed=3),
        work_dir=str(tmp_path),
    )
    a, b = tw.Trainer.from_config(cfg), tw.Trainer.from_config(cfg)
    try:
        assert torch.equal(a.unwrapped_model.head.weight, b.unwrapped_model.head.weight)
    finally:
        a.close()
        b.close()


def test_plain_dict_config_is_dumped_as_json(tmp_path: Path) -> None:
    trainer = tw.Trainer.from_config(dict(model=nn.Linear(2, 1), work_dir=str(tmp_path), experiment_name="r"))
    trainer.close()
    assert '"model": "Linear(' in (tmp_path / "r" / "config.json").read_text()


def test_registry_redefinition_and_did_you_mean() -> None:
    reg = Registry("widget", import_name="somewhere.WIDGETS")

    def make() -> type:
        class Widget:  # the same definition run twice (a config loaded twice)
            pass

        return Widget

    first, second = make(), make()
    reg.register(first)
    reg.register(second)
    assert reg.get("Widget") is second

    class Widget:  # another class under the same name: refused
        pass

    with pytest.raises(KeyError, match="already registered"):
        reg.register(Widget)
    with pytest.raises(
        KeyError, match=r"Unknown widget type 'Widgte'. Did you mean 'Widget'\?.*@somewhere.WIDGETS.register\(\)"
    ):
        reg.get("Widgte")
    assert MODELS.import_name == "trainwright.registry.MODELS" and DATASETS.name == "dataset"


def test_config_imported_as_a_module_and_loaded_as_a_config(tmp_path: Path) -> None:
    """Both define the config's classes; the second registration replaces the first instead of failing."""
    import importlib.util
    import sys

    path = _write(
        tmp_path / "both_ways.py",
        "from trainwright.registry import MODELS\n@MODELS.register()\nclass BothWaysNet:\n    pass\nmodel = "
        "dict(type='BothWaysNet')\n",
    )
    spec = importlib.util.spec_from_file_location("both_ways_module", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["both_ways_module"] = module
    spec.loader.exec_module(module)
    Config.fromfile(path)
    assert (
        MODELS.get("BothWaysNet") is not module.BothWaysNet and MODELS.get("BothWaysNet").__qualname__ == "BothWaysNet"
    )
    del sys.modules["both_ways_module"]


def test_mmengine_helper_variables_load_with_a_warning_while_typos_are_refused(tmp_path) -> None:
    """``data_root`` / ``train_pipeline`` at top level (mmengine style) load; a near-miss of a Trainer argument does
    not."""
    from trainwright.trainer.from_config import trainer_from_config

    cfg = dict(
        model=nn.Linear(2, 1), work_dir=str(tmp_path), data_root="data/x/", train_pipeline=[dict(type="LoadImage")]
    )
    with pytest.warns(UserWarning, match=r"\['data_root', 'train_pipeline'\] are not Trainer arguments"):
        trainer = trainer_from_config(tw.Trainer, cfg)
    trainer.close()
    with pytest.raises(ConfigError, match="Did you mean 'work_dir'"):
        trainer_from_config(tw.Trainer, {**cfg, "work_dri": str(tmp_path)})


@pytest.mark.parametrize(
    "key",
    [
        "norm_cfg",
        "optimizer",
        "tta_model",
        "interval",
        "crop_size",
        "train_dataset",
        "gallery_dataloader",
        "val_interval",
    ],
)
def test_mmengine_helper_variables_that_resemble_an_argument_load_with_the_hint_in_the_warning(tmp_path, key) -> None:
    """Real OpenMMLab configs keep ``norm_cfg`` (mmseg models), ``optimizer`` (mmseg schedules), ``tta_model``,
    ``interval`` at top level."""
    from trainwright.trainer.from_config import trainer_from_config

    cfg = dict(model=nn.Linear(2, 1), work_dir=str(tmp_path), **{key: dict(type="X")})
    with pytest.warns(
        UserWarning, match=rf"\['{key}'\] are not Trainer arguments: taken as helper variables"
    ) as record:
        trainer_from_config(tw.Trainer, cfg).close()
    if key in ("optimizer", "tta_model"):  # still a hint, in the warning, for a key that was meant as an argument
        assert "If one was meant as an argument:" in str(record[0].message) and "Did you mean" in str(record[0].message)


@pytest.mark.parametrize("typo", ["trian_cfg", "val_cgf", "load_form", "resum", "writer", "custom_hook"])
def test_typos_of_trainer_arguments_are_refused(tmp_path, typo) -> None:
    from trainwright.trainer.from_config import trainer_from_config

    with pytest.raises(ConfigError, match=f"Unknown top-level config key '{typo}'. Did you mean"):
        trainer_from_config(tw.Trainer, dict(model=nn.Linear(2, 1), work_dir=str(tmp_path), **{typo: None}))


#: An mmengine schedule file with a warm-restart cosine (per iteration) and a plateau reduction on accuracy.
MM_RESTART_PLATEAU_SCHEDULE = """
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=0.0001))
param_scheduler = [
    dict(type='CosineRestartLR', periods=[2, 2], restart_weights=[1, 0.5], eta_min=0.0, by_epoch=True, convert_to_iter_based=True),
    # 'acc' is mmengine's spelling (no 'val/' prefix); an abs threshold of 1.0 makes every validation after the first a bad one
    dict(type='ReduceOnPlateauLR', monitor='acc', rule='greater', factor=0.5, patience=0, threshold=1.0, threshold_rule='abs'),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=4, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
"""


def test_mmengine_config_with_restart_cosine_and_plateau_trains_end_to_end(tmp_path: Path, components: str) -> None:
    import math
    import warnings

    path = _mm_config(tmp_path, components)
    _write(tmp_path / "configs/_base_/schedules/toy_sgd.py", MM_RESTART_PLATEAU_SCHEDULE)
    with pytest.warns(UserWarning, match="default_scope.*ignored"):
        trainer = tw.Trainer.from_config(Config.fromfile(path), experiment_name="restart_plateau")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no misuse warning from the schedulers
            trainer.train()
        cosine, plateau = trainer.param_schedulers
        assert (type(cosine).__name__, cosine.by_epoch, cosine.periods) == (
            "CosineRestartLR",
            False,
            [12, 12],
        )  # 6 iterations per epoch
        assert (
            type(plateau).__name__ == "ReduceOnPlateauLR" and plateau.last_step == 2
        )  # validations after epochs 1-3 ([0, 4))
        # Validations 2 and 3 (after the restart at iteration 12) halve the second cycle; the cycle then holds its last value.
        base = 0.05  # the config's lr override
        want = 0.25 * 0.5 * base * (1 + math.cos(math.pi * 11 / 12)) / 2
        assert trainer.optim_wrapper.optimizer.param_groups[0]["lr"] == pytest.approx(want, rel=1e-12)
    finally:
        trainer.close()


def test_auto_scale_lr_counts_data_shards_under_tensor_parallelism(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainwright.trainer.mmengine_cfg import _auto_scale_lr

    monkeypatch.setattr(tw.dist, "launched_world_size", lambda: 4)
    kwargs: dict = dict(
        train_dataloader=dict(batch_size=16),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        strategy=dict(type="fsdp", tensor_parallel=dict(size=2, plan={})),
    )
    line = _auto_scale_lr(dict(enable=True, base_batch_size=64), kwargs)
    assert kwargs["optim_wrapper"]["optimizer"]["lr"] == pytest.approx(0.1 * 16 * 2 / 64)  # 4 processes, 2 data shards
    assert line is not None and "16 x 2 data shard(s)" in line


def test_mmengine_logger_hook_arguments_load(tmp_path) -> None:
    """mmseg's schedules: ``LoggerHook(interval=50, log_metric_by_epoch=False)``; mmengine's other LoggerHook
    arguments too."""
    from torch.utils.data import TensorDataset

    data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    logger = dict(type="LoggerHook", interval=2, log_metric_by_epoch=False, interval_exp_name=1000, keep_local=True)
    cfg = dict(
        model=nn.Linear(2, 1),
        work_dir=str(tmp_path),
        train_dataloader=dict(dataset=data, batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=2),
        default_hooks=dict(logger=logger, checkpoint=None),
    )
    trainer = tw.Trainer.from_config(cfg)
    assert trainer.hooks.get(tw.hooks.LoggerHook).interval == 2
    trainer.close()
    with pytest.raises(ConfigError, match="keep_local=False"):
        tw.Trainer.from_config({**cfg, "default_hooks": dict(logger={**logger, "keep_local": False})})


def test_a_top_level_data_preprocessor_is_the_models_unless_it_names_its_own(tmp_path: Path, components: str) -> None:
    """mmpretrain's dataset bases set ``data_preprocessor = dict(...)`` at top level: mmengine's Runner hands it to
    the model dict."""
    __import__(components)
    dp = dict(type="NormalizingDataPreprocessor", mean=[100.0], std=[0.5])
    model = dict(type="TinyClassifier", backbone=dict(type="TinyBackbone"))
    trainer = tw.Trainer.from_config(dict(model=model, work_dir=str(tmp_path), data_preprocessor=dp))
    pre = trainer.unwrapped_model.data_preprocessor
    assert (
        type(pre).__name__ == "NormalizingDataPreprocessor"
        and pre.mean.tolist() == [100.0]
        and pre.std.tolist() == [0.5]
    )
    trainer.close()
    own = dict(model, data_preprocessor=dict(type="BaseDataPreprocessor"))
    trainer = tw.Trainer.from_config(dict(model=own, work_dir=str(tmp_path), data_preprocessor=dp))
    assert type(trainer.unwrapped_model.data_preprocessor).__name__ == "BaseDataPreprocessor"
    trainer.close()


def test_a_sampler_seed_is_named_as_unused(tmp_path: Path) -> None:
    from torch.utils.data import TensorDataset

    loader = dict(
        dataset=TensorDataset(torch.randn(8, 2)),
        batch_size=4,
        sampler=dict(type="DefaultSampler", shuffle=True, seed=123),
    )
    with pytest.warns(
        UserWarning, match=r"train_dataloader.sampler seed=123 is not used: the data order follows the run's seed"
    ):
        tw.Trainer.from_config(dict(model=nn.Linear(2, 1), work_dir=str(tmp_path), train_dataloader=loader)).close()


def test_mmengines_dataset_wrappers_build_from_a_config(tmp_path: Path, components: str) -> None:
    """mmdet's VOC configs: ``RepeatDataset(times=3, dataset=ConcatDataset(datasets=[...]))``."""
    __import__(components)
    inner = dict(
        type="ConcatDataset", datasets=[dict(type="ToyBlobs", n=16, seed=0), dict(type="ToyBlobs", n=8, seed=1)]
    )
    loader = dict(dataset=dict(type="RepeatDataset", times=3, dataset=inner), batch_size=8, shuffle=False)
    cfg = dict(
        model=dict(type="TinyClassifier", backbone=dict(type="TinyBackbone")),
        work_dir=str(tmp_path),
        train_dataloader=loader,
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=None),
    )
    trainer = tw.Trainer.from_config(cfg)
    trainer.train()
    assert trainer.progress.iteration == 9  # (16 + 8) samples x 3 / 8 per batch
    dataset = trainer.train_loop.dataloader.dataset
    assert (
        len(dataset) == 72
        and torch.equal(dataset[24][0], dataset[0][0])
        and torch.equal(dataset[16][0], dataset.dataset.datasets[1][0][0])
    )
    trainer.close()
