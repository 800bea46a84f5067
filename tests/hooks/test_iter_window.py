"""train_iter_interval may return a window (a range of iteration numbers): the hook is called exactly there."""

from __future__ import annotations

import pytest

import trainwright as tw


class Window(tw.Hook):
    def __init__(self, window: range | int) -> None:
        self.window = window
        self.before: list[int] = []
        self.after: list[int] = []

    def train_iter_interval(self, trainer):
        return self.window

    def before_train_iter(self, trainer, batch_idx, data_batch=None):
        self.before.append(trainer.progress.iteration + 1)

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        self.after.append(trainer.progress.iteration)


@pytest.mark.parametrize("window", [range(5, 8), range(9, 13), range(2, 19, 4), range(0)])
def test_called_exactly_inside_the_window_across_epochs_and_beside_interval_hooks(trainer_factory, window):
    hook, every3 = Window(window), Window(3)
    t = trainer_factory(custom_hooks=[hook, every3], train_cfg=dict(max_epochs=2))  # 10 iterations per epoch
    t.train()
    assert hook.before == hook.after == list(window)  # epoch ends (10, 20) outside the window do not count
    assert every3.after == [3, 6, 9, 10, 12, 15, 18, 20]


def test_window_counts_resumed_iterations_run_wide(trainer_factory, tmp_path):
    t = trainer_factory(
        work_dir=tmp_path,
        train_cfg=dict(by_epoch=False, max_iters=6),
        default_hooks=dict(checkpoint=dict(interval=3, by_epoch=False)),
    )
    t.train()
    hook = Window(range(8, 10))
    t2 = trainer_factory(
        work_dir=tmp_path,
        train_cfg=dict(by_epoch=False, max_iters=12),
        resume=True,
        custom_hooks=[hook],
        default_hooks=dict(checkpoint=None),
    )
    t2.train()
    assert hook.after == [8, 9]


@pytest.mark.parametrize("bad", [range(0, 3), range(5, 1, -1), -1, 1.5])
def test_bad_window_is_an_error_naming_the_hook(trainer_factory, bad):
    t = trainer_factory(custom_hooks=[Window(bad)])
    with pytest.raises(ValueError, match="Window.train_iter_interval"):
        t.train()
