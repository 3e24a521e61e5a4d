"""Freed pymalloc arenas kept for reuse (python/src/arena.c,
pymalloc_keep_mb): a map's results die together, and without the cache
the arenas they filled go back to the system and are faulted in again by
the next map."""
import os

import pytest

import fiber
from fiber import _fiber

# With PYTHONMALLOC=malloc (or malloc_debug) CPython takes no arenas.
pytestmark = pytest.mark.skipif(
    os.environ.get("PYTHONMALLOC", "").startswith("malloc"),
    reason="pymalloc is off (PYTHONMALLOC): no arenas to keep")


def churn(n=1_000_000):
    # n distinct ints (32 bytes each: about 32 MiB of arenas) made and freed
    xs = list(range(1_000_000, 1_000_000 + n))
    del xs


def kept_after_churn(mb):
    # In a worker: what it keeps after the same churn, with the bound it
    # received from the master (mb: checked against it).
    churn()
    n, each, most = _fiber.arenas_kept()
    return n, each, most, _fiber.config_get("pymalloc_keep_mb")


@pytest.fixture
def bound():
    before = _fiber.config_get("pymalloc_keep_mb")
    yield
    _fiber.config_set("pymalloc_keep_mb", before)


def test_freed_arenas_are_kept_up_to_the_bound_and_reused(bound):
    _fiber.config_set("pymalloc_keep_mb", "4")
    churn()
    n, each, most = _fiber.arenas_kept()
    assert most == 4 << 20
    assert each > 0 and n * each == most      # full: 32 MiB were freed
    churn(20_000)                              # takes some, gives them back
    assert _fiber.arenas_kept()[0] == n
    keep = list(range(2_000_000, 3_000_000))  # 32 MB stays alive: new
    assert _fiber.arenas_kept()[0] == 0         # arenas came from the cache
    del keep
    assert _fiber.arenas_kept()[0] == n


def test_a_lower_bound_frees_what_is_kept_and_zero_turns_it_off(bound):
    _fiber.config_set("pymalloc_keep_mb", "8")
    churn()
    n, each, _ = _fiber.arenas_kept()
    assert n * each == 8 << 20
    _fiber.config_set("pymalloc_keep_mb", "2")
    n, each, most = _fiber.arenas_kept()
    assert most == 2 << 20 and n * each == 2 << 20
    _fiber.config_set("pymalloc_keep_mb", "0")
    assert _fiber.arenas_kept()[0] == 0
    churn()
    assert _fiber.arenas_kept()[0] == 0


def test_a_bad_bound_is_refused_by_name(bound):
    with pytest.raises(fiber.ConfigError, match="pymalloc_keep_mb.*0 to 64"):
        _fiber.config_set("pymalloc_keep_mb", "65")
    with pytest.raises(fiber.ConfigError, match="pymalloc_keep_mb"):
        _fiber.config_set("pymalloc_keep_mb", "lots")


def test_workers_keep_the_bound_the_master_set(bound):
    _fiber.config_set("pymalloc_keep_mb", "3")
    with fiber.Pool(1) as pool:
        n, each, most, text = pool.apply(kept_after_churn, (3,))
    assert text == "3" and most == 3 << 20
    assert each > 0 and n * each == 3 << 20
