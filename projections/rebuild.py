"""Every run's checkpoint from one pass over the log, in the order the runs began.

Folding run by run reads each run through the (run_id, seq) index: a lookup and a page
of scattered reads per run, most of a rebuild's time. A store that can scan its log in
position order (``EventStore.scans_in_order``) is read once instead: each stretch of
consecutive events of a run is folded onto that run's partial checkpoint. The partial
checkpoints of the runs met most recently stay in memory (at most ``hold``); the others
are encoded into a spill file (ledger/spill.py) until their run comes round again, so a
log whose runs are all live at once is neither held whole nor refolded. When the scan
ends, the checkpoints are read back in order of each run's first position, which is the
order a run-by-run rebuild writes them in: the rebuilt rows, and their ordinals, are the
same.

A forked run's fold starts with its parent's prefix, which the scan may already have
passed; such a run is only noted here, and folded whole from the log when its rows are
written (forks are rare).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from handoff.ledger.spill import Spill
from handoff.ledger.store import EventStore
from handoff.reducers.checkpoint import AGGREGATE, Checkpoint

from .views import decode_checkpoint, encode_checkpoint

#: Partial checkpoints held in memory during the scan; past this, the least recently
#: met quarter is spilled. ~1-3 KB each.
HOLD = 2000


def fold_in_one_pass(
    store: EventStore, until_position: int, *, hold: int | None = None
) -> Iterator[tuple[str, int, Checkpoint | None]]:
    """(run_id, last position, checkpoint) for every run that began by ``until_position``,
    folded over the log up to it, in the order the runs began; the checkpoint is None for
    a forked run, which the caller folds whole (``Transaction.fold``)."""
    spill = Spill()
    try:
        _scan(store, until_position, spill, max(HOLD if hold is None else hold, 1))
        for run_id, last, blob in spill.in_order():
            yield run_id, last, None if blob is None else decode_checkpoint(blob)
    finally:
        spill.close()


def _scan(store: EventStore, until_position: int, spill: Spill, hold: int) -> None:
    held: OrderedDict[str, list] = OrderedDict()  # run_id -> [first, last, checkpoint]
    forks: set[str] = set()
    spilled = False
    evolve_all = AGGREGATE.evolve_all
    initial = AGGREGATE.initial
    for run_id, first, last, steps in store.scan_runs(until_position=until_position):
        entry = held.get(run_id)
        if entry is not None:
            held.move_to_end(run_id)
            entry[1] = last
            entry[2] = evolve_all(entry[2], steps)
            continue
        if run_id in forks:
            continue
        back = spill.get(run_id) if spilled else None
        if back is None:  # the run's first events
            if steps[0].type == "run_forked":
                forks.add(run_id)
                spill.put_many([(first, run_id, last, None)])
                continue
            entry = [first, last, evolve_all(initial(run_id), steps)]
        else:
            entry = [back[0], last, evolve_all(decode_checkpoint(back[2]), steps)]  # type: ignore[arg-type]
        held[run_id] = entry
        if len(held) > hold:
            out = [held.popitem(last=False) for _ in range(max(hold // 4, 1))]
            spill.put_many([(f, r, la, encode_checkpoint(cp)) for r, (f, la, cp) in out])
            spilled = True
    spill.put_many([(f, r, la, encode_checkpoint(cp)) for r, (f, la, cp) in held.items()])
