"""Model outputs that carry their loss as an attribute (Hugging Face's ``ModelOutput``): what trains and what is logged.

trainwright's loss contract is a dict of losses: every key containing ``"loss"`` is summed and back-propagated, every
other entry is logged. A Hugging Face model returns a ``ModelOutput`` instead: its ``loss`` is already the total, and
its other fields (logits, a key/value cache, hidden states, attentions) are results, not numbers to log. Such a *model
output* (:func:`carries_loss`, by duck typing: transformers is never imported here) trains from ``output.loss`` alone,
and only ``loss`` is logged (:func:`output_losses`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch


def carries_loss(output: Any) -> bool:
    """Whether ``output`` is a model output that carries its loss as an attribute.

    A ``ModelOutput`` is also an ``OrderedDict``, so it must be told apart from a dict of losses on purpose. A model
    output is

    * an object that is **not** a mapping and has a ``loss`` attribute (any class or dataclass),
    * or a mapping that is a **dataclass instance** with a ``loss`` field (``ModelOutput`` is both;
      a plain ``dict`` or a config dict never is).

    Plain dicts, tensors, lists and tuples are never model outputs: they keep the
    dict-of-losses contract. A tuple is never read as one: ``return_dict=False`` outputs have no names, and guessing
    that the first element is the loss would silently train on the wrong value when it is not.
    """
    if type(output) is dict or isinstance(output, (torch.Tensor, list, tuple)):
        return False
    if isinstance(output, Mapping):
        return dataclasses.is_dataclass(output) and any(f.name == "loss" for f in dataclasses.fields(output))
    return hasattr(output, "loss")


def output_losses(output: Any) -> Any:
    """``{"loss": output.loss}`` for a model output that carries its loss; anything else unchanged.

    Args:
        output: What the model's forward returned in ``"loss"`` mode.

    Returns:
        A dict of losses holding only ``loss`` (so logits, caches, hidden states and attentions
        are neither summed nor logged), or ``output`` itself when it is not a model output.

    Raises:
        ValueError: The output's ``loss`` is None (a Hugging Face model computes it only when
            the batch holds its targets).
        TypeError: The output's ``loss`` is not a tensor.
    """
    if not carries_loss(output):
        return output
    loss = output.loss
    if loss is None:
        raise ValueError(
            f"The model returned a {type(output).__name__} whose loss is None: the model computed no loss. A Hugging "
            "Face model "
            "computes it only when the batch holds its targets (`labels` for a language model or a classifier): have "
            "the dataset "
            "or collate_fn return them (e.g. transformers' DataCollatorForLanguageModeling), or return a loss from "
            "forward."
        )
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"The model returned a {type(output).__name__} whose loss is a {type(loss).__name__}, not a tensor: an "
            "output with a "
            "`loss` attribute trains from that attribute, so it must be the loss tensor (return a dict of losses "
            "otherwise)."
        )
    return {"loss": loss}
