# test_strategies.py: the strategies alone, for a quick stateless property of the folds.
from hypothesis import given

from handoff.testing import as_records, events
from handoff.reducers.checkpoint import fold


@given(events().map(lambda e: as_records([e])))
def test_any_single_event_folds_to_seq_one(records):
    assert fold(records, "r1").last_seq == 1
