"""A loader dict's sampler is never handed to torch's DataLoader as a dict: mmengine's become a real sampler, others
are refused."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import RandomSampler, TensorDataset

from trainwright.data import make_dataloader
from trainwright.registry import ConfigError


def test_mmengines_sampler_dicts_become_samplers_and_others_are_refused() -> None:
    data = TensorDataset(torch.arange(6.0))
    loader = make_dataloader(
        dict(dataset=data, batch_size=2, sampler=dict(type="mmengine.DefaultSampler", shuffle=False))
    )
    # pseudo_collate (mmengine's Runner default): a batch of 1-tuples is one list of the samples' values
    assert [torch.stack(b[0]).tolist() for b in loader] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    loader = make_dataloader(
        dict(dataset=data, batch_size=3, sampler=dict(type="InfiniteSampler"), collate_fn=dict(type="default_collate"))
    )
    assert sorted(torch.cat([b[0] for b in loader]).tolist()) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert isinstance(
        loader.sampler, RandomSampler
    )  # shuffle=True: the Trainer makes it a seeded, sharded EpochSampler
    with pytest.raises(
        ConfigError, match=r"train_dataloader.sampler=.*'ClassAwareSampler'.*pass the built object .*dataset indices"
    ):
        make_dataloader(dict(dataset=data, batch_size=2, sampler=dict(type="ClassAwareSampler")), "train_dataloader")
    from torch.utils.data import DataLoader

    with pytest.raises(
        ConfigError,
        match=r"a DataLoader built with sampler=\{'type': 'DefaultSampler'\}, whose keys torch hands the dataset as "
        r"indices",
    ):
        make_dataloader(DataLoader(data, batch_size=2, sampler=dict(type="DefaultSampler")), "train_dataloader")
    with pytest.raises(ConfigError, match=r"shuffle=False and sampler shuffle=True: give one of them"):
        make_dataloader(dict(dataset=data, batch_size=2, shuffle=False, sampler=dict(type="DefaultSampler")))
    with pytest.raises(ConfigError, match=r"\['drop_last'\] are not arguments of mmengine's DefaultSampler"):
        make_dataloader(dict(dataset=data, batch_size=2, sampler=dict(type="DefaultSampler", drop_last=True)))


def test_mmengines_python_style_configs_name_the_sampler_and_collate_classes() -> None:
    from trainwright.dataset import DefaultSampler, InfiniteSampler, default_collate

    data = TensorDataset(torch.arange(4.0))
    loader = make_dataloader(
        dict(
            dataset=data,
            batch_size=2,
            sampler=dict(type=DefaultSampler, shuffle=False),
            collate_fn=dict(type=default_collate),
        )
    )
    assert [b[0].tolist() for b in loader] == [[0.0, 1.0], [2.0, 3.0]]
    assert isinstance(
        make_dataloader(dict(dataset=data, batch_size=2, sampler=dict(type=InfiniteSampler))).sampler, RandomSampler
    )
    with pytest.raises(
        TypeError, match=r"give it as a dataloader dict's sampler, sampler=dict\(type=DefaultSampler, shuffle=True\)"
    ):
        DefaultSampler(data, shuffle=True)
