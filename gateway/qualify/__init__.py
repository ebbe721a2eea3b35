"""Lane qualification: a lane serves only after three gates passed for its current identity.

- determinism: a fixed suite at temperature 0 with a fixed seed hashes the same as last time;
- sink probe: short greetings never come back empty;
- A/B/A performance: candidate, baseline, candidate, judged against the candidate's own drift.

`gateway qualify LANE` runs the gates and writes a record (``records.py``); the gateway reads the
records when routes load and refuses a lane with no passing record for its identity
(``feature.py``), unless routes.yaml gives it ``override: {reason: ...}``.
"""

from .identity import LaneIdentity, lane_identity

__all__ = ["LaneIdentity", "lane_identity"]
