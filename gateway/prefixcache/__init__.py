"""The gateway's model of each replica's prefix cache: one index per replica over the token blocks of
every prompt it served, whatever conversation sent it (model.py), and what it adds to a turn's verdict
(shared.py)."""

from .model import ReplicaBlocks, key_block
from .shared import SharedPrefixes

__all__ = ["ReplicaBlocks", "SharedPrefixes", "key_block"]
