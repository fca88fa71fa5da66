"""The base of every config section: unknown keys refused, fields documented by their docstrings.

Kept apart from `rollwise.config` so that sections defined in other modules (`rollwise.config_rewards`) share it
without importing the whole run config.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section: extra keys forbidden, assignments validated, inf/nan refused in every float field."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True, frozen=False,
                              allow_inf_nan=False)
