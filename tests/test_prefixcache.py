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


def test_a_request_finds_only_the_blocks_there_when_it_was_sent() -> None:
    blocks = ReplicaBlocks(None)
    blocks.store([1, 2, 3, 4], prompt_blocks=3, ready=10.0, done=12.0)  # prompt prefilled at 10, output by 12
    assert blocks.held([1, 2, 3, 4], at=9.0) == 0  # sent while it was still prefilling
    assert blocks.held([1, 2, 3, 4], at=11.0) == 3  # the prompt's blocks, not yet the output's
    assert blocks.held([1, 2, 3, 4], at=12.0) == 4
    blocks.store([1, 2, 5], prompt_blocks=3, ready=20.0, done=21.0)  # a later use keeps when they were first there
    assert blocks.held([1, 2, 5], at=11.0) == 2 and blocks.held([1, 2, 5], at=20.0) == 3
