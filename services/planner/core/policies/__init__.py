"""Every policy module; importing this package registers them all."""

from services.planner.core.policies import baselines, omru, reference  # noqa: F401
