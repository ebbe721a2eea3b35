"""Per-tenant rate limits: requests and tokens per minute and concurrent requests, shared by every
gateway process through Redis (or per process without it). See policy.py."""

from .policy import RateLimits

__all__ = ["RateLimits"]
