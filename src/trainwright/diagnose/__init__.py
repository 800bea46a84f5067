"""Run diagnosis: where a non-finite loss came from (found by replaying, at no cost until needed). See
docs/diagnose.md."""

from trainwright.diagnose.nonfinite import DiagnosedRun, Finding, ReplayLoop, Watch, explain_nonfinite

__all__ = ["DiagnosedRun", "Finding", "ReplayLoop", "Watch", "explain_nonfinite"]
