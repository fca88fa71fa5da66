"""The trainer's one user-facing error type, in its own module so every part of the trainer can raise it."""

from __future__ import annotations


class TrainerError(ValueError):
    """A user-fixable problem (bad model path, missing optional dependency, inconsistent options)."""
