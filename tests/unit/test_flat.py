"""The flat buffers a module's parameters live in (adloco.library.flat): freed with their module, and a copy of
the module gets buffers of its own."""

from __future__ import annotations

import copy
import gc
import weakref

from torch import nn

from adloco.library.flat import flatten


def test_a_flattened_module_is_freed_and_a_copy_gets_its_own_buffer() -> None:
    m = nn.Linear(64, 64)
    flat = flatten(m)
    copied = copy.deepcopy(m)
    flat_copy = flatten(copied)
    assert flat_copy is not flat and flat_copy.param.data_ptr() == copied.weight.data_ptr()
    module, buffer = weakref.ref(m), weakref.ref(flat)
    del m, flat
    gc.collect()
    assert module() is None and buffer() is None
