"""mmengine's ``log_processor``: window_size and custom_cfg honoured by the logger (from a config too)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import LinearReg, RecordLosses, regression_set, train_records

import trainwright as tw


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_window_size_averages_the_last_n_iterations_at_each_line(trainer_factory: Any) -> None:
    ref = RecordLosses()
    t = trainer_factory(
        dataset=regression_set(24),
        batch_size=2,
        train_cfg=dict(by_epoch=False, max_iters=12),
        custom_hooks=[ref],
        default_hooks=dict(checkpoint=None, logger=dict(interval=2, window_size=5)),
    )
    t.train()
    recs = train_records(t.run_dir)
    assert [r["iter"] for r in recs] == [2, 4, 6, 8, 10, 12]
    for r in recs:  # as mmengine: the last 5 values (fewer at the start), so lines overlap
        window = [ref.losses[i] for i in range(max(1, r["iter"] - 4), r["iter"] + 1)]
        assert r["loss"] == pytest.approx(_mean(window), rel=1e-12, abs=0)


def test_custom_statistics_over_the_epoch_a_window_and_the_whole_run(trainer_factory: Any) -> None:
    ref = RecordLosses()
    custom = [
        dict(data_src="loss", method_name="max", window_size="epoch", log_name="loss_max_epoch"),
        dict(data_src="loss", method_name="mean", window_size="global", log_name="loss_global"),
        dict(data_src="loss", method_name="min", window_size=3, log_name="loss_min3"),
        dict(data_src="loss", method_name="current", log_name="loss_now"),
    ]
    t = trainer_factory(
        dataset=regression_set(20),
        batch_size=2,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        custom_hooks=[ref],  # 10 per epoch
        default_hooks=dict(checkpoint=None, logger=dict(interval=4, custom_cfg=custom)),
    )
    t.train()
    recs = train_records(t.run_dir)
    assert [r["iter"] for r in recs] == [4, 8, 10, 14, 18, 20]
    for r in recs:
        it = r["iter"]
        epoch_start = (it - 1) // 10 * 10
        assert r["loss_max_epoch"] == pytest.approx(
            max(ref.losses[i] for i in range(epoch_start + 1, it + 1)), rel=1e-12
        )
        assert r["loss_global"] == pytest.approx(_mean([ref.losses[i] for i in range(1, it + 1)]), rel=1e-9)
        assert r["loss_min3"] == pytest.approx(min(ref.losses[i] for i in range(it - 2, it + 1)), rel=1e-12)
        assert r["loss_now"] == pytest.approx(ref.losses[it], rel=1e-12)


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        (dict(method_name="mean"), "data_src"),
        (dict(data_src="loss", method_name="median"), "method_name must be one of"),
        (dict(data_src="loss", window_size=0), "window_size must be an int >= 1, 'epoch' or 'global'"),
        (dict(data_src="loss", method_name="max", window_size="global"), "'global' supports method_name='mean' only"),
        (dict(data_src="loss", windw_size=3), "unknown keys"),
    ],
)
def test_a_bad_custom_entry_is_named(cfg: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tw.hooks.LoggerHook(custom_cfg=[cfg])


def test_a_config_log_processor_configures_the_logger(tmp_path: Path) -> None:
    cfg = dict(
        model=LinearReg(),
        work_dir=str(tmp_path),
        train_dataloader=dict(dataset=regression_set(12), batch_size=2),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05)),
        train_cfg=dict(by_epoch=False, max_iters=6),
        default_hooks=dict(checkpoint=None, logger=dict(interval=2)),
        log_level="WARNING",
        log_processor=dict(
            type="LogProcessor",
            window_size=4,
            by_epoch=True,
            num_digits=4,
            custom_cfg=[dict(data_src="loss", method_name="max", window_size=3, log_name="loss_max")],
        ),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = tw.Trainer.from_config(cfg)
    messages = [str(w.message) for w in caught]
    assert any("log_processor.by_epoch=True but train_cfg.by_epoch=False" in m for m in messages)
    assert any("log_processor ['num_digits']" in m for m in messages)
    logger = t.hooks.get(tw.hooks.LoggerHook)
    assert (
        logger is not None
        and logger.interval == 2
        and logger.window_size == 4
        and [c.log_name for c in logger.custom] == ["loss_max"]
    )
    t.train()
    assert all("loss_max" in r for r in train_records(t.run_dir))
    t.close()
    from trainwright.config import ConfigError

    with pytest.raises(ConfigError, match="log_processor: unknown keys"):
        tw.Trainer.from_config({**cfg, "log_processor": dict(window_sze=4)})


def test_mmengine_iteration_loop_type_with_log_processor_by_epoch_false_agrees(tmp_path: Path) -> None:
    """mmseg's default_runtime: ``train_cfg=dict(type='IterBasedTrainLoop')`` and
    ``log_processor=dict(by_epoch=False)`` agree (no warning)."""
    cfg = dict(
        model=LinearReg(),
        work_dir=str(tmp_path),
        train_dataloader=dict(dataset=regression_set(16), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05)),
        train_cfg=dict(type="IterBasedTrainLoop", max_iters=4),
        log_processor=dict(by_epoch=False),
        default_hooks=dict(checkpoint=None),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tw.Trainer.from_config(cfg).close()
    assert not [w for w in caught if "log_processor.by_epoch" in str(w.message)]
