"""The classifier's main test: labelled mutations of generated conversations (tests/support/drift_fuzz.py).

`make test` runs FUZZ_DRIFT_EXAMPLES (default 2,000) examples; `make fuzz-drift` runs 50,000.
"""

from __future__ import annotations

import os
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.conversations.causes import CAUSES
from gateway.render.renderer import Renderer
from tests.support.drift_fuzz import COMBINABLE, LABELS, MUTATIONS, STABLE, composes, run, run_pair, scenarios

EXAMPLES = int(os.environ.get("FUZZ_DRIFT_EXAMPLES", "2000"))
RENDERER = Renderer()
SEEN: Counter[str] = Counter()


def test_catalogue_covers_every_drift_cause() -> None:
    assert len(MUTATIONS) >= 25
    labels = set().union(*LABELS.values())
    # Not the classifier's: the engine's report, the router, identity (a rejoined turn) and a shared head.
    drift_causes = set(CAUSES) - {"unknown", "eviction", "rehomed", "output_retokenized", "client_retried_turn",
                                  "shared_prefix"}
    assert drift_causes <= labels, drift_causes - labels
    assert sum(1 for v in LABELS.values() if v <= {STABLE, "reasoning_dropped_by_template"}) >= 10  # neutral kinds


# `make test` runs a fixed set of examples (the same every run, so CI never depends on the draw);
# `make fuzz-drift` draws new ones every run.
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=EXAMPLES <= 2000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_labelled_mutations(data: st.DataObject) -> None:
    s = data.draw(scenarios(), label="scenario")
    names = sorted(n for n, (applies, _, _) in MUTATIONS.items() if applies(s))
    name = data.draw(st.sampled_from(names), label="mutation")
    MUTATIONS[name][1](s, data.draw)
    SEEN[name] += 1
    outcome = run(RENDERER, s, name)
    assert outcome.mismatch() is None, (outcome.mismatch(), outcome)


PAIRS: Counter[str] = Counter()


# Two edits in one turn, in one message or in two: the cause is the first one in render order.
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=EXAMPLES <= 2000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_two_mutations_in_one_turn(data: st.DataObject) -> None:
    s = data.draw(scenarios(), label="scenario")
    names = [n for n in COMBINABLE if MUTATIONS[n][0](s)]
    a = data.draw(st.sampled_from(names), label="first")
    b = data.draw(st.sampled_from([n for n in names if composes(a, n)]), label="second")
    PAIRS[f"{a}+{b}"] += 1
    outcome = run_pair(RENDERER, s, a, b, data.draw)
    assert outcome.mismatch() is None, (outcome.mismatch(), outcome)
