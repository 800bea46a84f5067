"""Checks a user runs on their own training: ``verify_resume`` (is a resumed run bitwise the uninterrupted one?)."""

from trainwright.verify.compare import Check, ResumeReport
from trainwright.verify.probe import ResumeProbe
from trainwright.verify.resume import VerifyRunError, verify_resume

__all__ = ["Check", "ResumeProbe", "ResumeReport", "VerifyRunError", "verify_resume"]
