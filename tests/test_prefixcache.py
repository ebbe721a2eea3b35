"""The gateway's model of one replica's prefix cache: held prefixes and least-recently-used eviction."""

from __future__ import annotations

from gateway.prefixcache import ReplicaBlocks


def test_the_longest_held_prefix_whoever_stored_it() -> None:
    blocks = ReplicaBlocks(None)
    blocks.store([1, 2, 3, 4])  # one conversation's prompt
    assert blocks.held([1, 2, 3, 9, 4]) == 3  # another's, sharing the first three blocks
    assert blocks.held([9, 1]) == 0


def test_the_least_recently_used_blocks_leave_first() -> None:
    blocks = ReplicaBlocks(10)
    blocks.store(list(range(100, 106)))  # an older session
    blocks.store(list(range(200, 205)))  # a newer one: 11 blocks, within the batch margin
    blocks.store(list(range(100, 106)))  # the older session's next turn touches its blocks again
    blocks.store([300])  # past the margin: the least recently used blocks go until the pool fits
    assert len(blocks) == 10 and blocks.evicted == 2
    assert blocks.held(list(range(100, 106))) == 6  # recently used: kept
    assert blocks.held(list(range(200, 205))) == 0  # its first blocks were the least recent
