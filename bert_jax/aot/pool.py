"""Compiling processes for the planner, one configuration each, whose lifetime a `with` block owns.

Each configuration compiles in a fresh process: libtpu 0.0.42.1 (with jax 0.10.2) crashed (SIGSEGV) compiling
BERT-base's step for v5e:16x16 on an fsdp mesh in a process that had compiled a data-parallel one, and compiled it
in a fresh one; a crash then costs one candidate, not the plan.
"""

import multiprocessing
import pickle

from bert_jax import runtime
from bert_jax.aot import compiling
from bert_jax.aot.report import AotReport


class CompilerCrashedError(RuntimeError):
    """XLA's compiler ended the process that compiled a configuration: a crash, not a verdict on the configuration."""


class CompilerPool:
    """`with CompilerPool() as pool: pool.compile(config, topology, num_slices)`. The next compiling process is
    started while the current one compiles, so that its interpreter start and imports (about 2 s of each compile)
    overlap the compile; leaving the block stops the one still waiting, whether the block ended well or raised."""

    def __init__(self):
        self._spare = None  # (process, connection) of the next compiling process, or None

    def __enter__(self) -> "CompilerPool":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def compile(self, config, topology: str, num_slices: int) -> AotReport:
        """compiling.compile_train_step's report, compiled in a process of its own; its errors raised here."""
        process, connection = self._spare if self._spare else _start_compiler()
        self._spare = None
        if not process.is_alive():  # a spare that died waiting
            connection.close()
            process, connection = _start_compiler()
        self._spare = _start_compiler()
        try:
            connection.send((config, topology, num_slices))
            succeeded, result = connection.recv()
        except (EOFError, ConnectionError):
            raise CompilerCrashedError("XLA's compiler crashed (the compiling process died)") from None
        finally:
            connection.close()
            process.join()
        if not succeeded:
            raise result
        return result

    def close(self) -> None:
        """Stops the waiting spare process."""
        if self._spare:
            process, connection = self._spare
            self._spare = None
            connection.close()  # the spare reads end-of-file and exits
            process.join()


def _start_compiler():
    context = multiprocessing.get_context("spawn")  # never fork a process with JAX's threads running
    connection, child_end = context.Pipe()
    process = context.Process(target=_compile_when_asked, args=(child_end,), daemon=True)
    process.start()
    child_end.close()
    return process, connection


def _compile_when_asked(connection) -> None:
    """A compiling process: one configuration from `connection`, its report (or the error) sent back."""
    runtime.set_up_collector()  # it traces the step, as the driver does
    try:
        config, topology, num_slices = connection.recv()
    except EOFError:  # released unused
        return
    try:
        result = True, compiling.compile_train_step(config, topology, num_slices)[1]
    except Exception as error:  # pylint: disable=broad-except  # re-raised in the planner's process
        result = False, error
    try:
        connection.send(result)
    except (pickle.PicklingError, TypeError, AttributeError):  # an error that does not pickle: its text
        connection.send((False, RuntimeError(f"{type(result[1]).__name__}: {result[1]}")))
