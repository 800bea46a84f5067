"""Logging: per-trainer logger, MetricStore (the one owner of logged numbers, lazy sync), writers."""

from typing import TYPE_CHECKING

from trainwright.logging.agreement import Agreement, LoggedValuesDisagreeError
from trainwright.logging.history_buffer import HistoryBuffer
from trainwright.logging.lines import PendingLines
from trainwright.logging.log_processor import CustomStat, LogProcessor
from trainwright.logging.logger import close_logger, create_logger, log_lines
from trainwright.logging.message_hub import MessageHub
from trainwright.logging.metric_store import MetricStore
from trainwright.logging.resume import Resumed
from trainwright.logging.writers import (
    DEFAULT_WRITERS,
    WRITERS,
    AnyAhead,
    ConsoleWriter,
    JsonlWriter,
    LineInfo,
    Resuming,
    SaveAhead,
    Writer,
    WriterError,
    Writers,
    WriterSource,
    build_writers,
)
from trainwright.utils.lazy import lazy_names

if TYPE_CHECKING:
    from trainwright.logging.csv_writer import CsvWriter
    from trainwright.logging.mlflow_writer import MlflowWriter
    from trainwright.logging.tensorboard_writer import TensorBoardWriter
    from trainwright.logging.wandb_writer import WandbWriter

#: Loaded on first use (PEP 562): a run keeps only the code it uses.
__getattr__, __dir__ = lazy_names(__name__, __file__, globals())

__all__ = [
    "MessageHub",
    "create_logger",
    "close_logger",
    "log_lines",
    "Agreement",
    "LoggedValuesDisagreeError",
    "HistoryBuffer",
    "MetricStore",
    "PendingLines",
    "LogProcessor",
    "CustomStat",
    "Writer",
    "Writers",
    "WriterError",
    "WriterSource",
    "SaveAhead",
    "AnyAhead",
    "LineInfo",
    "Resumed",
    "Resuming",
    "ConsoleWriter",
    "JsonlWriter",
    "WRITERS",
    "DEFAULT_WRITERS",
    "build_writers",
    "CsvWriter",
    "TensorBoardWriter",
    "WandbWriter",
    "MlflowWriter",
]
