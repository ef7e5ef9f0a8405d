"""bert_jax.aot.pool: the planner's compiling processes live only as long as the `with` block that owns them."""

import psutil
import pytest

from bert_jax.aot.pool import CompilerPool
from configs import pretrain


def _compiling_children() -> set[int]:
    """This process's children, less multiprocessing's resource tracker: the first spawned process starts it for
    the whole interpreter, and it is no compiler's."""
    return {child.pid for child in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(child.cmdline())}


def test_the_pool_leaves_no_process_behind_also_when_a_compile_raises():
    before = _compiling_children()
    during = set()
    # A topology libtpu is not asked about: the compiling process refuses it before any compile, and the planner's
    # process raises its ValueError, naming the flag.
    with pytest.raises(ValueError, match="--topology='v9x:2x2'"):
        with CompilerPool() as pool:
            try:
                pool.compile(pretrain.get_config("size=tiny"), "v9x:2x2", 1)
            finally:
                during = _compiling_children() - before
    assert during, "the pool keeps a spare compiling process waiting inside its block"
    assert _compiling_children() == before
