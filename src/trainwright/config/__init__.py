"""Config files: ``Config.fromfile`` (``.py`` / ``.yaml`` / ``.json``), ``_base_`` inheritance, overrides, dumps.

``Trainer.from_config(cfg)`` builds a trainer from the result; ``trainwright train CONFIG`` does both.
"""

from trainwright.config.config import Config, ConfigDict, import_modules, merge
from trainwright.config.overrides import DictAction, parse_overrides, parse_value
from trainwright.registry import ConfigError

__all__ = [
    "Config",
    "ConfigDict",
    "ConfigError",
    "DictAction",
    "import_modules",
    "merge",
    "parse_overrides",
    "parse_value",
]
