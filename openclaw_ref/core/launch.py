"""Run a function on N ranks of a real torch.distributed process group.

Two ways in, one contract:

* ``RankPool(cfg)`` starts N processes once, joins them into one process group through a
  ``TCPStore`` that the parent hosts on a loopback socket it bound to port 0 (never a fixed
  port, never a public interface), and then runs any number of tasks on them. The ranks are
  forked from a server that imported torch once per parent (``rank_start``), so starting them
  costs no interpreter start each. ``launch()`` is a pool used once.
* Under ``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment) ``launch()`` runs the function
  in this very process, initialised through ``env://`` — multi-node included.

Failure contract (what the parent guarantees):
  - a rank that raises sends its traceback back; the parent raises ``RankFailed`` naming that rank
    and kills the siblings at once;
  - a rank that dies without a word (SIGABRT from gloo on a size mismatch, ``os._exit``) is named
    with its exit code or signal;
  - a task past its deadline makes the pending ranks dump their stacks (faulthandler, SIGUSR1),
    each into its own file, then all ranks are killed and ``LaunchTimeout`` names the late ranks
    a rank's watchdog named (else the ranks that had not finished) and the folder of their
    stacks (the CLI prints them only with --verbose);
  - no rank outlives the parent (``PR_SET_PDEATHSIG``) or a broken pool.
The rank's end of the pipe (its messages, last words and exit) is ``rank_process``.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from openclaw_ref.core.errors import LaunchTimeout, RankFailed
from openclaw_ref.core.rank_process import (
    die_with_parent,
    exit_with,
    failure_message,
    fatal_reporter,
    register_stack_dump,
    request_stacks,
    send,
)
from openclaw_ref.core.rank_start import StartEnvironment, rank_context
from openclaw_ref.core.triage import FailureTriage, Report
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.sync.evidence.heartbeat import LATE_KEY, read_late

BACKENDS = ("auto", "gloo", "nccl")
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class LaunchConfig:
    world_size: int
    backend: str = "auto"
    timeout_s: float = 600.0  # deadline of one task on the pool
    pg_timeout_s: float = 120.0  # torch's own collective timeout (gloo's default is 30 min)
    threads_per_rank: int | None = None  # default: cores // local ranks, at least 1
    host: str = "127.0.0.1"  # the rendezvous store listens here and nowhere else

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise BadInput(f"world size must be >= 1; got {self.world_size}")
        if self.backend not in BACKENDS:
            raise BadInput(f"backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")
        if self.timeout_s <= 0 or self.pg_timeout_s <= 0:
            raise BadInput("timeouts must be positive")


@dataclass
class RankContext:
    """What a task function learns about where it runs."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device
    store: dist.Store  # the rendezvous store: heartbeats and watchdog keys live here
    # How any thread of this rank reports a fatal error and leaves (set by the launcher).
    fatal: Callable[[BaseException], None] | None = field(default=None, repr=False, compare=False)
    ends_on_failure: bool = False  # a failed task ends the process (torchrun), not the pool's

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def report_fatal(self, exc: BaseException) -> None:
        """Send ``exc`` to the parent as this rank's failure and exit the process at once with
        its exit code. Callable from any thread — a watchdog's, while the main thread is stuck
        inside a collective. Never returns."""
        if self.fatal is not None:
            self.fatal(exc)
        exit_with(exc)


def resolve_backend(backend: str, local_world_size: int) -> str:
    """The process group's backend. ``auto``: NCCL with one GPU per local rank when that many
    GPUs exist, else gloo. ``nccl``: NCCL with one GPU per local rank; with fewer GPUs than local
    ranks (one GPU, two ranks), gloo with CUDA tensors, the ranks sharing the GPUs
    (``on_cuda``) — NCCL refuses two ranks on one GPU. No GPU at all: ``BadInput``."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if gpus >= local_world_size else "gloo"
    if backend == "nccl":
        if gpus == 0:
            raise BadInput("backend nccl needs CUDA GPUs; this machine has none "
                           "(use --backend gloo or auto)")
        return "nccl" if gpus >= local_world_size else "gloo"
    return backend


def on_cuda(backend: str, local_world_size: int) -> bool:
    """Whether ranks launched with ``backend`` keep their tensors on a GPU: always under NCCL,
    and under a requested ``nccl`` that fell back to gloo for want of GPUs."""
    return backend == "nccl" or resolve_backend(backend, local_world_size) == "nccl"


def under_torchrun() -> bool:
    return all(v in os.environ for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def _set_threads(cfg: LaunchConfig, local_world_size: int) -> None:
    n = cfg.threads_per_rank or max(1, (os.cpu_count() or 1) // local_world_size)
    torch.set_num_threads(n)


def _device_for(cuda: bool, local_rank: int) -> torch.device:
    """Local rank ``r``'s device: GPU ``r mod GPUs`` (several ranks share one when there are
    fewer GPUs than ranks), else the CPU."""
    if cuda:
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _rank_main(rank: int, cfg: LaunchConfig, backend: str, port: int, conn: mpc.Connection,
               stacks_dir: str, env: StartEnvironment) -> None:
    """A started rank: join the group, then serve tasks until told to stop."""
    env.apply()
    die_with_parent()
    register_stack_dump(stacks_dir, rank)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # single node: gloo pairs on loopback too
    _set_threads(cfg, cfg.world_size)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # NCCL errors abort, not hang
    timeout = datetime.timedelta(seconds=cfg.pg_timeout_s)
    send_lock = threading.Lock()
    try:
        store = dist.TCPStore(cfg.host, port, cfg.world_size + 1, False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=cfg.world_size,
                                timeout=timeout)
        ctx = RankContext(rank, cfg.world_size, rank, cfg.world_size, backend,
                          _device_for(on_cuda(cfg.backend, cfg.world_size), rank), store,
                          fatal_reporter(conn, send_lock))
        send(conn, ("ready",), send_lock)
    except BaseException as exc:
        send(conn, failure_message(exc), send_lock)
        os._exit(1)
    while True:
        task = conn.recv()
        if task is None:
            break
        fn, args = task
        try:
            send(conn, ("ok", fn(ctx, *args)), send_lock)
        except BaseException as exc:
            send(conn, failure_message(exc), send_lock)
            sys.stderr.flush()
            os._exit(1)  # the group may be wedged; destroy_process_group can hang here
    try:
        dist.destroy_process_group()
    finally:
        conn.close()
        os._exit(0)


def loopback_listener(host: str) -> socket.socket:
    """A listening socket on ``host`` only, for a ``TCPStore`` server (``master_listen_fd``):
    torch's server left to itself listens on every interface (``::``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(256)
    return sock


class RankPool:
    """N spawned ranks in one process group, reused across tasks (see module docstring)."""

    def __init__(self, cfg: LaunchConfig, start_timeout_s: float = 180.0) -> None:
        self.cfg = cfg
        self.backend = resolve_backend(cfg.backend, cfg.world_size)
        self._procs: list[mp.process.BaseProcess] = []
        self._conns: list[mpc.Connection] = []
        self._broken = False
        self._closed = False
        self._stacks_dir = tempfile.mkdtemp(prefix="openclaw-stacks-")  # kept if one is dumped
        self._stacks_dumped = False
        listener = loopback_listener(cfg.host)
        port = listener.getsockname()[1]
        self._store = dist.TCPStore(
            cfg.host, port, cfg.world_size + 1, True,
            timeout=datetime.timedelta(seconds=cfg.pg_timeout_s),
            wait_for_workers=False, master_listen_fd=listener.detach())
        ctx, env = rank_context(), StartEnvironment()
        for rank in range(cfg.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            p = ctx.Process(target=_rank_main, args=(rank, cfg, self.backend, port, child_end,
                                                         self._stacks_dir, env),
                            name=f"openclaw-rank{rank}", daemon=True)
            p.start()
            child_end.close()
            self._procs.append(p)
            self._conns.append(parent_end)
        try:
            self._collect(start_timeout_s, "starting the process group")
        except BaseException:
            self.kill()
            raise

    @property
    def store(self) -> dist.Store:
        """The parent's handle on the rendezvous store (e.g. to read heartbeats)."""
        return self._store

    @property
    def broken(self) -> bool:
        """True once a failure or ``close`` stopped the ranks; make a new pool then."""
        return self._broken

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def run(self, fn: Callable[..., Any], *args: Any,
            timeout_s: float | None = None) -> list[Any]:
        """Run ``fn(ctx, *args)`` on every rank; results in rank order. ``fn`` must be
        importable."""
        if self._broken:
            raise RuntimeError("this RankPool was stopped after a failure; make a new one")
        self._store.delete_key(LATE_KEY)  # an earlier task's diagnosis is not this one's
        for conn in self._conns:
            conn.send((fn, args))
        try:
            return self._collect(timeout_s or self.cfg.timeout_s, getattr(fn, "__name__", "task"))
        except BaseException:
            self.kill()
            raise

    def _collect(self, timeout_s: float, what: str) -> list[Any]:
        """Every rank's reply to the current task, or the failure named by ``FailureTriage``
        (which rank is to blame is decided from exit status and reports, not pipe readiness)."""
        deadline = time.monotonic() + timeout_s
        triage = FailureTriage(range(self.cfg.world_size))
        results: dict[int, Any] = {}
        listening = {self._conns[r]: r for r in range(self.cfg.world_size)}
        alive = {self._procs[r].sentinel: r for r in range(self.cfg.world_size)}
        while len(results) < self.cfg.world_size:
            now = time.monotonic()
            blame = triage.decide(now)
            if blame is not None:
                raise RankFailed(blame.rank, blame.summary, blame.traceback_text, blame.cause)
            if now >= deadline:
                unfinished = sorted(set(range(self.cfg.world_size)) - set(results))
                self._stacks_dumped = True
                request_stacks([self._procs[r].pid for r in unfinished
                                if self._procs[r].is_alive() and self._procs[r].pid])
                raise self._past_deadline(what, timeout_s, unfinished)
            wake = min(deadline, triage.wake_at() or deadline)
            for obj in mpc.wait(list(listening) + list(alive), timeout=max(0.0, wake - now)):
                if obj in listening:
                    self._receive(obj, listening, results, triage)
                elif obj in alive:
                    rank = alive.pop(obj)
                    conn = self._conns[rank]
                    while conn in listening:  # its last words, if any, precede its exit
                        self._receive(conn, listening, results, triage)
                    self._procs[rank].join(1.0)
                    triage.exited(rank, self._procs[rank].exitcode)
        return [results[r] for r in range(self.cfg.world_size)]

    def _past_deadline(self, what: str, timeout_s: float, unfinished: list[int]
                       ) -> LaunchTimeout:
        """The deadline's error: the late ranks a watchdog named, else every unfinished rank."""
        late, said = read_late(self._store), f"{what} did not finish within {timeout_s:.0f} s"
        if late is None or not late[1]:
            return LaunchTimeout(said, ranks=unfinished, stacks_dir=self._stacks_dir)
        return LaunchTimeout(f"{said}; rank {late[0]}'s watchdog names the late ranks (of the "
                             f"unfinished {unfinished})", ranks=late[1],
                             stacks_dir=self._stacks_dir)

    @staticmethod
    def _receive(conn: mpc.Connection, listening: dict[mpc.Connection, int],
                 results: dict[int, Any], triage: FailureTriage) -> None:
        """Read one message (or the end of the pipe) from a rank into ``results``/``triage``."""
        rank = listening[conn]
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            del listening[conn]  # the sentinel reports how the process ended
            return
        if msg[0] == "error":
            _, summary, tb, cause = msg
            triage.report(Report(rank, summary, tb, cause), time.monotonic())
            return
        results[rank] = msg[1] if len(msg) > 1 else None
        triage.finish(rank)
        del listening[conn]

    def close(self, grace_s: float = 10.0) -> None:
        """Stop every rank: politely when healthy, by SIGKILL otherwise. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self._broken:
            for conn in self._conns:
                try:
                    conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
            deadline = time.monotonic() + grace_s
            for p in self._procs:
                p.join(max(0.0, deadline - time.monotonic()))
        self._broken = True
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(5)
        for conn in self._conns:
            conn.close()
        if not self._stacks_dumped:
            shutil.rmtree(self._stacks_dir, ignore_errors=True)
        self._store = None  # the store owns the listening socket and closes it with itself

    def kill(self) -> None:
        """Stop every rank at once: after a failure the siblings are stuck in collectives."""
        self._broken = True
        self.close()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def init_from_torchrun(cfg: LaunchConfig) -> RankContext:
    """Join the job torchrun set up (``env://``); works multi-node. Idempotent."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    backend = resolve_backend(cfg.backend, local_world)
    _set_threads(cfg, local_world)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # NCCL errors abort, not hang
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://",
                                timeout=datetime.timedelta(seconds=cfg.pg_timeout_s))
    store = dist.distributed_c10d._get_default_store()
    return RankContext(rank, world, local_rank, local_world, backend,
                       _device_for(on_cuda(cfg.backend, local_world), local_rank), store,
                       ends_on_failure=True)


def run_in_torchrun_rank(fn: Callable[..., Any], cfg: LaunchConfig, *args: Any) -> Any:
    """Run ``fn(ctx, *args)`` as this torchrun rank. A group this call created is destroyed
    after a successful task, so no process-group thread is still joinable when the interpreter
    tears down (that ends a clean run in "terminate called without an active exception").
    After a failure the group may be wedged in a collective: it is left alone, and the process
    must end through ``exit_process``."""
    owns_group = not dist.is_initialized()
    result = fn(init_from_torchrun(cfg), *args)
    if owns_group:
        dist.barrier()  # no rank tears its half of a pair down while a sibling still uses it
        dist.destroy_process_group()
    return result


def exit_process(code: int) -> None:
    """End this process with ``code``. With a live process group (a failed torchrun rank),
    flush and ``os._exit``: tearing a wedged group down can hang, and its C++ threads abort the
    interpreter's shutdown. Otherwise exit normally."""
    if dist.is_available() and dist.is_initialized():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


def launch(fn: Callable[..., Any], cfg: LaunchConfig, *args: Any) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``cfg.world_size`` ranks and return their results.

    Under torchrun this process is one rank: the list holds only this rank's result and
    ``cfg.world_size`` is ignored in favour of ``WORLD_SIZE``.
    """
    if under_torchrun():
        return [run_in_torchrun_rank(fn, cfg, *args)]
    with RankPool(cfg) as pool:
        return pool.run(fn, *args)
