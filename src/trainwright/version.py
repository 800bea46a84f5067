"""The package version (``trainwright.__version__``), recorded in each checkpoint's ``meta``."""

__version__ = "0.1.0"
