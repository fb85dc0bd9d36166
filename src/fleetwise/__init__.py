"""fleetwise: plan, verify and run parallel and PD-disaggregated LLM inference fleets."""

__version__ = "0.1.0"
