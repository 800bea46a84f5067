"""Logging: per-trainer logger, MetricStore (windowed scalars, lazy sync), writers."""

from trainwright.logging.logger import close_logger, create_logger, log_lines
from trainwright.logging.metric_store import HistoryBuffer, MetricStore
from trainwright.logging.writers import JsonlWriter

__all__ = ["create_logger", "close_logger", "log_lines", "HistoryBuffer", "MetricStore", "JsonlWriter"]
