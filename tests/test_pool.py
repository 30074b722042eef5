"""The Unified Tensor Pool's allocators: placement, coalescing, accounting, errors, invariants."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snlite.device import ALIGNMENT_BYTES
from snlite.pool import HostPool, PoolFullError, PoolStats, RawAllocator, TensorPool, format_map

KB = 1024


def check_invariants(pool: TensorPool) -> None:
    """What must hold after every call: live blocks and free regions tile [0, capacity) exactly."""
    live = sorted((off, size) for off, (_, size) in pool.allocations().items())
    free = list(pool.free_regions())
    assert sum(size for _, size in live) == pool.stats().in_use_bytes
    assert pool.stats().free_bytes + pool.stats().in_use_bytes == pool.capacity_bytes
    assert sum(size for _, size in free) == pool.stats().free_bytes
    for (a, sa), (b, _) in zip(free, free[1:]):
        assert a + sa < b, f"free regions {a}+{sa} and {b} overlap or should have been coalesced"
    pos = 0
    for off, size in sorted(live + free):  # no gaps, no overlaps
        assert off == pos, f"region at {off} but the previous one ended at {pos}"
        assert off % pool.block_bytes == 0 and off % ALIGNMENT_BYTES == 0
        pos = off + size
    assert pos == pool.capacity_bytes
    assert pool.largest_free_block() == max((s for _, s in free), default=0)
    assert pool.stats().high_water_bytes >= max((o + s for o, s in live), default=0)


def fragment(pool: TensorPool, sizes_blocks, free_indices):
    """Allocate blocks of the given sizes in order, then free the chosen ones: a hole pattern."""
    offsets = [pool.alloc(n * pool.block_bytes, f"t{i}") for i, n in enumerate(sizes_blocks)]
    for i in free_indices:
        pool.free(offsets[i])
    return offsets


# ---------------------------------------------------------------- placement
def script(pool):
    rng = random.Random(7)
    live, offsets = [], []
    for i in range(200):
        if live and rng.random() < 0.4:
            pool.free(live.pop(rng.randrange(len(live))))
        elif pool.can_fit(n := rng.randrange(0, 5000)):
            live.append(pool.alloc(n, f"t{i}"))
            offsets.append(live[-1])
    return offsets


@pytest.mark.parametrize("fit", ["first", "best"])
def test_same_calls_give_same_offsets(fit):
    assert script(TensorPool(64 * KB, fit)) == script(TensorPool(64 * KB, fit))


def fragmented(fit):
    """10 blocks; blocks of 3, 1, 2, 1, 1, 1 allocated, then the 3 and the 2 freed: holes of 3, 2, 1."""
    pool = TensorPool(10 * KB, fit)
    fragment(pool, [3, 1, 2, 1, 1, 1], [0, 2])
    return pool


@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_first_and_best_fit_on_a_fragmented_pool(blocks):
    regions, need = fragmented("first").free_regions(), blocks * KB
    assert regions == fragmented("best").free_regions() and len(regions) == 3
    first = min(off for off, size in regions if size >= need)  # lowest address that fits
    best = min((size, off) for off, size in regions if size >= need)[1]  # smallest region that fits
    assert fragmented("first").alloc(need, "x") == first
    assert fragmented("best").alloc(need, "x") == best
    if blocks < 3:  # here the policies really differ: first takes the big hole, best the snug one
        assert first != best


def test_best_fit_breaks_ties_by_lowest_address():
    pool = TensorPool(8 * KB, "best")
    fragment(pool, [1] * 8, [5, 1, 3])  # three one-block holes
    lowest = min(off for off, _ in pool.free_regions())
    assert lowest == 1 * KB and pool.alloc(1, "x") == lowest


@pytest.mark.parametrize("fit", ["first", "best"])
def test_freeing_everything_coalesces_back_to_one_region(fit):
    pool = TensorPool(100 * KB, fit)
    rng = random.Random(3)
    offsets = [pool.alloc(rng.randrange(1, 4000), f"t{i}") for i in range(40)]
    rng.shuffle(offsets)
    for off in offsets:
        pool.free(off)
        check_invariants(pool)
    assert pool.free_regions() == ((0, pool.capacity_bytes),)
    assert pool.largest_free_block() == pool.capacity_bytes and pool.stats().fragmentation == 0.0


def test_sizes_are_rounded_to_whole_blocks_and_zero_bytes_takes_one():
    pool = TensorPool(16 * KB)
    assert [pool.reserved_bytes(n) for n in (0, 1, KB, KB + 1)] == [KB, KB, KB, 2 * KB]
    assert pool.stats().total_allocs == 0  # reserved_bytes is a pure function
    a, b = pool.alloc(0, "empty1"), pool.alloc(0, "empty2")
    assert a != b and pool.stats().in_use_bytes == 2 * KB


def test_offsets_are_aligned_for_every_block_size():
    for block in (256, 512, 768, 1024, 4096):
        pool = TensorPool(64 * KB, block_bytes=block)
        offsets = [pool.alloc(n, "t") for n in (1, 300, 999, 257, 0, 5000)]
        assert all(off % ALIGNMENT_BYTES == 0 and off % block == 0 for off in offsets)
        check_invariants(pool)


@pytest.mark.parametrize("block", [0, -256, 100, 1000, 300])
def test_block_bytes_must_be_a_positive_multiple_of_256(block):
    with pytest.raises(ValueError, match="multiple of 256"):
        TensorPool(64 * KB, block_bytes=block)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="fit"):
        TensorPool(KB, fit="worst")
    with pytest.raises(ValueError, match="a request must be >= 0 bytes, got -1"):
        TensorPool(KB).alloc(-1, "neg")
    for pool in (TensorPool, RawAllocator):  # the capacity is named, not "a request"
        with pytest.raises(ValueError, match="a pool's capacity must be >= 0 bytes, got -5"):
            pool(-5)
    with pytest.raises(TypeError, match=r"a request must be a whole number of bytes \(an int\), got float"):
        TensorPool(KB).alloc(10.5, "half a byte")
    assert TensorPool(10 * KB + 100).capacity_bytes == 10 * KB  # rounded down to whole blocks


def test_freeing_an_unknown_offset_is_a_clear_error():
    pool = TensorPool(8 * KB)
    off = pool.alloc(10, "a")
    with pytest.raises(ValueError, match="no live allocation has that offset"):
        pool.free(off + KB)
    pool.free(off)
    with pytest.raises(ValueError, match="double free"):
        pool.free(off)


# ---------------------------------------------------------------- errors and accounting
def test_pool_full_error_names_the_request_and_the_pool_state_and_changes_nothing():
    pool = TensorPool(10 * KB)
    fragment(pool, [3, 1, 2, 1, 1, 1], [0, 2])
    before = (pool.stats(), pool.free_regions(), pool.allocations())
    want = pool.largest_free_block() + 1
    assert not pool.can_fit(want)
    with pytest.raises(PoolFullError) as info:
        pool.alloc(want, "conv3", step="conv3 forward")
    err, s = info.value, before[0]
    assert isinstance(err, MemoryError)
    assert (err.name, err.nbytes, err.step, err.stats) == ("conv3", want, "conv3 forward", s)
    msg = str(err)
    for part in ("'conv3'", f"{want:,} bytes", "conv3 forward", f"capacity {s.capacity_bytes:,}",
                 f"in use {s.in_use_bytes:,}", f"largest free block {s.largest_free_bytes:,}",
                 f"free {s.free_bytes:,}", f"{s.fragmentation:.0%}", "budget", "liveness", "offload",
                 "recompute"):
        assert part in msg, f"{part!r} missing from: {msg}"
    assert (pool.stats(), pool.free_regions(), pool.allocations()) == before
    with pytest.raises(PoolFullError, match="at step 12"):
        pool.alloc(want, "x", step=12)


def test_stats_peak_and_high_water():
    pool = TensorPool(16 * KB)
    a, b, c = pool.alloc(KB, "a"), pool.alloc(2 * KB, "b"), pool.alloc(KB, "c")
    pool.free(b)
    s = pool.stats()
    assert s == PoolStats(capacity_bytes=16 * KB, in_use_bytes=2 * KB, peak_in_use_bytes=4 * KB,
                          free_bytes=14 * KB, largest_free_bytes=12 * KB,
                          fragmentation=1 - (12 * KB) / (14 * KB), allocations=2, total_allocs=3,
                          high_water_bytes=c + KB)
    pool.reset_peak()
    assert pool.stats().peak_in_use_bytes == 2 * KB and pool.stats().high_water_bytes == c + KB
    assert pool.allocations() == {a: ("a", KB), c: ("c", KB)}
    full = TensorPool(2 * KB)
    full.alloc(2 * KB, "all")
    assert full.stats().fragmentation == 0.0 and full.stats().free_bytes == 0


def test_host_pool_uses_256_byte_granularity():
    host = HostPool(4 * KB)
    assert host.block_bytes == ALIGNMENT_BYTES and host.reserved_bytes(300) == 512
    offs = [host.alloc(n, f"h{n}") for n in (1, 256, 257, 0)]
    assert offs == [0, 256, 512, 1024]
    assert host.peak_in_use_bytes == 1280
    check_invariants(host)
    for off in offs:
        host.free(off)
    assert host.free_regions() == ((0, 4 * KB),) and host.peak_in_use_bytes == 1280
    with pytest.raises(PoolFullError, match="host pool full.*host slab"):
        host.alloc(5 * KB, "too big")


def test_raw_allocator_accounts_one_allocation_per_tensor():
    raw = RawAllocator()
    handles = [raw.alloc(n, f"t{n}") for n in (0, 1, 256, 257)]
    assert len(set(handles)) == 4
    assert raw.stats().in_use_bytes == sum(raw.reserved_bytes(n) for n in (0, 1, 256, 257)) == 256 * 5
    assert raw.stats().capacity_bytes is None and raw.stats().free_bytes is None and raw.can_fit(10**15)
    raw.free(handles[1])
    assert raw.alloc(1, "again") not in handles  # handles are never reused
    with pytest.raises(ValueError, match="no live allocation"):
        raw.free(handles[1])
    assert raw.stats().peak_in_use_bytes == 256 * 5 and raw.stats().total_allocs == 5

    capped = RawAllocator(capacity_bytes=1000)
    capped.alloc(700, "a")  # reserves 768
    before = capped.stats()
    with pytest.raises(PoolFullError, match="raw allocator full"):
        capped.alloc(300, "b", step=4)
    assert capped.stats() == before and capped.stats().free_bytes == 1000 - 768


def test_format_map_draws_used_free_and_partly_used_cells():
    pool = TensorPool(8 * KB)
    a = pool.alloc(1500, "conv1")
    pool.alloc(100, "relu1")
    pool.free(a)
    assert format_map(pool, width=8) == "..#....."
    assert format_map(pool, width=4) == ".+.."  # 2 KB cells: the second is half used
    assert len(format_map(TensorPool(4 * KB), width=64)) == 4  # never finer than one block
    with pytest.raises(TypeError):
        format_map(RawAllocator())


# ---------------------------------------------------------------- random sequences
ops = st.lists(st.tuples(st.booleans(), st.integers(0, 6000), st.integers(0, 10**6)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, fit=st.sampled_from(["first", "best"]), block=st.sampled_from([256, 512, 1024]),
       capacity_kb=st.integers(0, 40))
def test_random_alloc_free_sequences_keep_the_books_straight(ops, fit, block, capacity_kb):
    pool = TensorPool(capacity_kb * KB, fit, block)
    live = []
    for is_alloc, nbytes, pick in ops:
        if is_alloc or not live:
            regions, need = pool.free_regions(), pool.reserved_bytes(nbytes)
            fits = [(off, size) for off, size in regions if size >= need]
            assert pool.can_fit(nbytes) == bool(fits)
            if not fits:
                with pytest.raises(PoolFullError):
                    pool.alloc(nbytes, "x")
                assert pool.free_regions() == regions
                continue
            off = pool.alloc(nbytes, f"t{len(live)}")
            expected = fits[0][0] if fit == "first" else min(fits, key=lambda r: (r[1], r[0]))[0]
            assert off == expected and off not in live
            live.append(off)
        else:
            pool.free(live.pop(pick % len(live)))
        check_invariants(pool)
        assert sorted(live) == sorted(pool.allocations())
