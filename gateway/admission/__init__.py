"""Admission that protects the prefix cache: a new conversation waits (or is refused) while the lane's pool
cannot hold it beside the conversations already active, so that running sessions keep their prefixes.

`sessions.py` keeps each lane's active conversations and what they hold; `policy.py` decides, on the
request path, for new conversations only.
"""
