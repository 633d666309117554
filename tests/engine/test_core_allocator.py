"""The native and the Python page allocators must behave identically, errors included."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine.core.page_allocator import PyPageAllocator

pytestmark = pytest.mark.skipif(not engine.native_available(), reason="native allocator not built")

OPS = st.lists(
    st.tuples(st.sampled_from(["allocate", "take", "incref", "free", "refcount", "is_free"]),
              st.integers(min_value=-2, max_value=20)),
    max_size=60,
)


def apply(alloc, op: str, arg: int):
    try:
        return ("ok", getattr(alloc, op)(arg))
    except ValueError as exc:
        return ("error", str(exc))


@settings(max_examples=10_000, deadline=None)
@given(num_blocks=st.integers(min_value=1, max_value=16), ops=OPS)
def test_native_and_python_agree(num_blocks, ops):
    from engine._page_allocator import PageAllocator

    native, python = PageAllocator(num_blocks), PyPageAllocator(num_blocks)
    for op, arg in ops:
        assert apply(native, op, arg) == apply(python, op, arg), (op, arg)
        assert native.num_free == python.num_free
        assert native.free_queue() == python.free_queue()
    assert native.capacity == python.capacity == num_blocks


@pytest.mark.parametrize("cls_name", ["native", "python"])
def test_errors_are_clear(cls_name):
    from engine._page_allocator import PageAllocator

    alloc = PageAllocator(4) if cls_name == "native" else PyPageAllocator(4)
    assert alloc.allocate(5) is None and alloc.num_free == 4  # all or nothing
    blocks = alloc.allocate(2)
    assert blocks == [0, 1]
    alloc.free(0)
    with pytest.raises(ValueError, match="double free of block 0"):
        alloc.free(0)
    with pytest.raises(ValueError, match="out of range"):
        alloc.free(7)
    with pytest.raises(ValueError, match="cannot incref free block 2"):
        alloc.incref(2)
    assert alloc.incref(1) == 2
    assert alloc.free(1) is False and alloc.free(1) is True
    # freed blocks go to the tail of the LRU queue
    assert alloc.free_queue() == [2, 3, 0, 1]
    with pytest.raises(ValueError):
        PageAllocator(0) if cls_name == "native" else PyPageAllocator(0)


def test_gil_released_allows_threads():
    import threading

    from engine._page_allocator import PageAllocator

    alloc = PageAllocator(1000)
    errors = []

    def churn():
        try:
            for _ in range(2000):
                got = alloc.allocate(3)
                if got:
                    for b in got:
                        alloc.free(b)
        except Exception as exc:  # pragma: no cover - the assertion reports it
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and alloc.num_free == 1000
