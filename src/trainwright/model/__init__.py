"""Models: the BaseModel contract, data preprocessors, plain-module adapter."""

from typing import TYPE_CHECKING

from trainwright.model.base_model import BaseModel, ModuleAdapter, as_base_model
from trainwright.model.data_preprocessor import BaseDataPreprocessor, NormalizingDataPreprocessor, cast_data
from trainwright.utils.lazy import lazy_names

if TYPE_CHECKING:
    from trainwright.model.ema import ExponentialMovingAverage

#: Loaded on first use (PEP 562): a run keeps only the code it uses.
__getattr__, __dir__ = lazy_names(__name__, __file__, globals())

__all__ = [
    "BaseModel",
    "ModuleAdapter",
    "as_base_model",
    "BaseDataPreprocessor",
    "NormalizingDataPreprocessor",
    "cast_data",
    "ExponentialMovingAverage",
]
