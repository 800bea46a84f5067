"""A small training run with its checkpoints on object storage, driven as a subprocess by test_remote.py.

The trainer is chaos_train's (dropout, shuffled data with a random augmentation, accumulation,
clipping, momentum, validation) with a schedule that does not depend on the number of epochs, so
a run of 2 epochs resumed to 4 equals a run of 4. It always starts with ``resume=True``.

Arguments: the work dir, ``--out-dir`` (a URL or a folder), ``--endpoint`` (the S3 endpoint, given
as ``storage_options``), ``--epochs``, ``--strategy``, ``--async-save``.

Fault injection (outside trainwright: it wraps the s3fs client):
    ``--hang-in-upload NAME``: the upload of the object whose key ends with NAME starts a multipart
    upload, sends one part, prints ``uploading NAME`` and hangs (the parent SIGKILLs it): the
    store holds an unfinished upload.

Output: ``start <iteration>``, ``iter <n>`` lines and, at the end, ``result.pt`` in the work dir
(the final model and optimizer states).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.utils.seed import set_random_seed

sys.path.insert(0, str(Path(__file__).parent))
from chaos_train import Net, NoisyBlobs, Report  # noqa: E402


def hang_in_upload(name: str) -> None:
    """Make s3fs's upload of ``...name`` send one part of a multipart upload, then hang (this is the test's
    instrument, not trainwright's code)."""
    import s3fs

    real = s3fs.S3FileSystem._call_s3

    async def call(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "put_object" and str(kwargs.get("Key", "")).endswith(name):
            mpu = await real(self, "create_multipart_upload", Bucket=kwargs["Bucket"], Key=kwargs["Key"])
            body = kwargs["Body"]
            await real(
                self,
                "upload_part",
                Bucket=kwargs["Bucket"],
                Key=kwargs["Key"],
                UploadId=mpu["UploadId"],
                PartNumber=1,
                Body=body[: len(body) // 2],
            )
            print(f"uploading {name}", flush=True)
            time.sleep(600)
        return await real(self, method, *args, **kwargs)

    s3fs.S3FileSystem._call_s3 = call  # type: ignore[method-assign]


def build(
    work_dir: str,
    out_dir: str | None,
    endpoint: str | None,
    epochs: int,
    strategy: str = "single",
    async_save: bool = False,
) -> tw.Trainer:
    """The trainer: checkpoints every epoch into ``out_dir`` (keep 2), logs copied to ``out_dir``'s ``logs``."""
    set_random_seed(7)
    options = dict(client_kwargs=dict(endpoint_url=endpoint)) if endpoint else None
    ckpt: dict[str, Any] = dict(interval=1, by_epoch=True, max_keep_ckpts=2, async_save=async_save)
    logger: dict[str, Any] = dict(interval=2)
    if out_dir is not None:
        ckpt.update(out_dir=out_dir, storage_options=options)
        if "://" in out_dir:
            logger.update(out_dir=out_dir.rstrip("/") + "-logs", storage_options=options)
    return tw.Trainer(
        model=Net(),
        work_dir=work_dir,
        experiment_name="run",
        strategy=strategy,
        train_dataloader=DataLoader(NoisyBlobs(100, 0), batch_size=10, shuffle=True),
        val_dataloader=DataLoader(NoisyBlobs(40, 1), batch_size=20),
        val_evaluator=tw.evaluation.Accuracy(),
        optim_wrapper=dict(
            optimizer=dict(type="SGD", lr=0.2, momentum=0.9), accumulative_counts=2, clip_grad=dict(max_norm=1.0)
        ),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=15),
            dict(type="MultiStepLR", by_epoch=True, begin=0, end=4, milestones=[3], gamma=0.5),
        ],
        train_cfg=dict(by_epoch=True, max_epochs=epochs, val_interval=1),
        default_hooks=dict(logger=logger, checkpoint=ckpt),
        custom_hooks=[Report(0.0)],
        randomness=dict(seed=7),
        resume=True,
        log_level="WARNING",
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir")
    parser.add_argument("--out-dir")
    parser.add_argument("--endpoint")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--strategy", default="single")
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--hang-in-upload")
    args = parser.parse_args()
    if args.hang_in_upload:
        hang_in_upload(args.hang_in_upload)
    trainer = build(args.work_dir, args.out_dir, args.endpoint, args.epochs, args.strategy, args.async_save)
    trainer.train()
    model = (
        trainer.strategy.full_model_state_dict() if args.strategy == "fsdp" else trainer.unwrapped_model.state_dict()
    )
    torch.save({"model": {k: v.detach().cpu().clone() for k, v in model.items()}}, Path(args.work_dir) / "result.pt")
    trainer.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
