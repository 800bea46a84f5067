"""Where checkpoints live: a Store written here used as out_dir, stores never shared between trainers, settings given
at build."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_trainer

from trainwright.checkpoint import load_file
from trainwright.checkpoint.storage import Store


class FlakyFolder:
    """A :class:`Store` of this test (not trainwright's): a local folder whose publishing fails for the names in
    ``fail``."""

    def __init__(self, root: Path, fail: tuple[str, ...] = ()) -> None:
        self.url = str(root)
        self.fail = set(fail)
        self.fallback_dir: Path | None = None
        self.checked = False

    def info(self, url: str) -> Mapping[str, Any] | None:
        p = Path(url)
        if not p.exists():
            return None
        return {
            "name": url,
            "type": "directory" if p.is_dir() else "file",
            "size": p.stat().st_size,
            "mtime": p.stat().st_mtime,
        }

    def list(self, url: str) -> list[Mapping[str, Any]]:
        return [self.info(str(p)) for p in sorted(Path(url).iterdir())] if Path(url).is_dir() else []  # type: ignore[misc]

    def read(self, url: str) -> bytes:
        return Path(url).read_bytes()

    def write(self, url: str, data: bytes) -> None:
        if Path(url).name in self.fail:
            raise ConnectionError(f"injected: the store refused {Path(url).name}")
        Path(url).parent.mkdir(parents=True, exist_ok=True)
        Path(url + ".part").write_bytes(data)
        os.replace(url + ".part", url)

    def publish(self, local: Path, url: str) -> None:
        self.write(url, local.read_bytes())

    def fetch(self, url: str, local: Path) -> None:
        local.write_bytes(Path(url).read_bytes())

    def remove(self, url: str) -> None:
        Path(url).unlink(missing_ok=True)

    def check(self, purpose: str = "checkpoints") -> None:
        Path(self.url).mkdir(parents=True, exist_ok=True)
        self.checked = True

    def explain(self, e: BaseException) -> str:
        return f"{type(e).__name__}: {e}"


def _epochs(work: Path, store: Store | Path, epochs: int, **kw: Any) -> Any:
    return make_trainer(
        work,
        checkpoint=dict(out_dir=store),
        default_hooks=dict(checkpoint=dict(interval=1)),
        train_cfg=dict(by_epoch=True, max_epochs=epochs),
        **kw,
    )


def test_a_store_of_the_user_keeps_a_failed_publish_locally_and_resume_finds_it(tmp_path: Path) -> None:
    root = tmp_path / "store"
    flaky = FlakyFolder(root, fail=("epoch_2.pth",))
    assert isinstance(flaky, Store)
    t = _epochs(tmp_path / "work", flaky, 2)
    with pytest.warns(
        UserWarning,
        match=r"Could not upload checkpoint .*store/epoch_2.pth \(ConnectionError: injected.*kept it locally as "
        r".*work/checkpoints_unuploaded/epoch_2.pth",
    ):
        t.train()
    t.close()
    kept = tmp_path / "work" / "checkpoints_unuploaded" / "epoch_2.pth"
    assert kept.is_file() and (root / "epoch_1.pth").is_file() and not (root / "epoch_2.pth").exists()
    assert (root / "latest").read_text() == "epoch_1.pth\n"  # `latest` still names the last published one
    assert flaky.checked  # probed when the trainer was built

    t2 = _epochs(tmp_path / "work", FlakyFolder(root), 3, resume=True)  # the store is back
    with pytest.warns(
        UserWarning, match=r"resume=True: resuming from .*checkpoints_unuploaded/epoch_2.pth, kept locally"
    ):
        t2.train()
    t2.close()
    assert t2.checkpoints.restored is not None and t2.checkpoints.restored[0] == kept
    assert (root / "latest").read_text() == "epoch_3.pth\n" and (root / "epoch_3.pth").is_file()

    reference = _epochs(tmp_path / "ref", tmp_path / "ref_ckpts", 3)  # one uninterrupted run, local folder
    reference.train()
    reference.close()
    expected = reference.unwrapped_model.state_dict()
    published = load_file(t2.checkpoints.ckpt_dir / "epoch_3.pth")["model"]  # read back through the store
    for name, value in t2.unwrapped_model.state_dict().items():
        assert torch.equal(value, expected[name]) and torch.equal(published[name], expected[name]), name


def test_two_trainers_on_two_remote_roots_do_not_share_a_store(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    # the second root lies under the first: a process-wide registry of stores by root handed the second trainer the
    # first's store
    a = make_trainer(tmp_path / "a", checkpoint=dict(out_dir="memory://tw-roots/run"))
    b = make_trainer(tmp_path / "b", checkpoint=dict(out_dir="memory://tw-roots/run/nested"))
    store_a, store_b = a.checkpoints.ckpt_dir.store, b.checkpoints.ckpt_dir.store
    assert store_a is not store_b
    assert (
        store_a.fallback_dir == tmp_path / "a" / "checkpoints_unuploaded"
    )  # each keeps failed uploads in its own work_dir
    assert store_b.fallback_dir == tmp_path / "b" / "checkpoints_unuploaded"
    for t in (a, b):
        t.build_train_loop()  # the model prepared, as train() does first
        t.checkpoints.save_now()  # an epoch-based run's save at an epoch's end: epoch_0.pth
    assert (
        load_file(a.checkpoints.ckpt_dir / "epoch_0.pth")["progress"]
        == load_file("memory://tw-roots/run/epoch_0.pth")["progress"]
    )
    assert [p.name for p in b.checkpoints.ckpt_dir.iterdir()] == ["epoch_0.pth", "latest"]
    a.close()
    b.close()


def test_checkpoint_settings_given_to_the_trainer_apply_to_a_save_before_train(tmp_path: Path) -> None:
    out = tmp_path / "ckpts"
    t = make_trainer(
        tmp_path / "work",
        checkpoint=dict(out_dir=out, iter_tmpl="step_{}.pth", save_optimizer=False, max_keep_ckpts=2),
        default_hooks=dict(checkpoint=dict(by_epoch=False, interval=2)),
        train_cfg=dict(by_epoch=False, max_iters=6),
    )
    t.build_train_loop()  # what train() builds first (the prepared model)
    first = t.checkpoints.save_now()  # before train(): the same folder, names and pieces as the run's own saves
    assert first == out / "step_0.pth" and (out / "latest").read_text() == "step_0.pth\n"
    assert "optim_wrapper" not in load_file(first) and "model" in load_file(first)
    t.train()
    t.close()
    # the save before train() is recorded as the run's own: keep-2 dropped it with the others
    assert sorted(p.name for p in out.iterdir()) == ["latest", "step_4.pth", "step_6.pth"]
    assert "optim_wrapper" not in load_file(out / "step_6.pth")
    assert not (tmp_path / "work" / "checkpoints").exists() or not any(
        (tmp_path / "work" / "checkpoints").glob("*.pth")
    )


def test_a_setting_given_twice_with_two_values_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'max_keep_ckpts' is given twice, as 3 and 2"):
        make_trainer(tmp_path, checkpoint=dict(max_keep_ckpts=3), default_hooks=dict(checkpoint=dict(max_keep_ckpts=2)))
    with pytest.raises(TypeError, match=r"unknown key 'out_dirs'.*Did you mean 'out_dir'"):
        make_trainer(tmp_path, checkpoint=dict(out_dirs="x"))
