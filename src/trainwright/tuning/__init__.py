"""Tuning helpers: hyper-parameter sweeps (:mod:`trainwright.tuning.sweep`)."""
