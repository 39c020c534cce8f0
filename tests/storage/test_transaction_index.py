"""The aborted-transaction index answers ``overlapping`` without scanning every entry (issue 14): a
binary search on markers, then a walk bounded by the suffix minimum of first offsets. Checked
against the plain definition (every entry with last_offset >= fetch and first_offset < upper) over
random appends, replays, truncations and reloads from disk."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.storage.transaction_index import AbortedTxn, TransactionIndex

# (kind, a, b): append a transaction of length a whose marker comes b offsets after the last one;
# truncate at a fraction; reload from the file (after a flush); or query [a, a + b).
_ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 60), st.integers(1, 8)),
    st.tuples(st.just("replay"), st.integers(0, 10), st.integers(0, 0)),
    st.tuples(st.just("truncate"), st.integers(0, 100), st.integers(0, 0)),
    st.tuples(st.just("reload"), st.integers(0, 0), st.integers(0, 0)),
    st.tuples(st.just("query"), st.integers(0, 400), st.integers(0, 120)),
), max_size=80)


def _brute(entries: list[AbortedTxn], fetch: int, upper: int) -> list[AbortedTxn]:
    return [e for e in entries if e.last_offset >= fetch and e.first_offset < upper]


@settings(max_examples=300, deadline=None)
@given(ops=_ops)
def test_overlapping_matches_the_definition(tmp_path_factory: object, ops: list[tuple[str, int, int]]) -> None:
    path = Path(tmp_path_factory.mktemp("txn")) / "0.txnindex"  # type: ignore[attr-defined]
    index = TransactionIndex(path)
    model: list[AbortedTxn] = []
    last = 0
    for kind, a, b in ops:
        if kind == "append":
            last += b
            entry = AbortedTxn(producer_id=a % 3, first_offset=max(0, last - a), last_offset=last,
                               last_stable_offset=0)
            index.append(entry)
            model.append(entry)
        elif kind == "replay" and model:  # a marker already indexed comes again: ignored
            index.append(model[-1 - a % len(model)])
        elif kind == "truncate":
            cut = last * a // 100
            index.truncate_to_offset(cut)
            model = [e for e in model if e.last_offset < cut]
            last = model[-1].last_offset if model else 0
        elif kind == "reload":
            index.flush()
            index = TransactionIndex(path)
            index.load(2**62)
        assert index.entries == model
        for fetch in range(0, last + 3, 3):
            for upper in (fetch, fetch + 1, fetch + 7, fetch + 40, 2**62):
                assert index.overlapping(fetch, upper) == _brute(model, fetch, upper), (fetch, upper)
        if kind == "query":
            assert index.overlapping(a, a + b) == _brute(model, a, a + b)


def test_a_long_transaction_is_found_past_many_short_ones() -> None:
    """A transaction that began early and aborted late is found for a fetch of its early offsets,
    though hundreds of aborts after the fetch range precede its marker (a walk that stopped at the
    first marker past the range would miss it)."""
    index = TransactionIndex(Path("/nonexistent/0.txnindex"))
    for i in range(500):
        index.append(AbortedTxn(1, 100 + 2 * i, 101 + 2 * i, 0))
    index.append(AbortedTxn(2, 5, 2000, 0))
    assert index.overlapping(0, 50) == [AbortedTxn(2, 5, 2000, 0)]
    assert index.overlapping(0, 101) == [AbortedTxn(1, 100, 101, 0), AbortedTxn(2, 5, 2000, 0)]
