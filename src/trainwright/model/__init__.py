"""Models: the BaseModel contract, data preprocessors, plain-module adapter."""

from trainwright.model.base_model import BaseModel, ModuleAdapter, as_base_model
from trainwright.model.data_preprocessor import BaseDataPreprocessor, NormalizingDataPreprocessor, cast_data
from trainwright.model.ema import ExponentialMovingAverage

__all__ = [
    "BaseModel",
    "ModuleAdapter",
    "as_base_model",
    "BaseDataPreprocessor",
    "NormalizingDataPreprocessor",
    "cast_data",
    "ExponentialMovingAverage",
]
