"""Every error the hook library raises on purpose, and the exit code each maps to.

Exit codes are fixed for the whole project: 0 ok, 2 bad input, 3 a consistency check fired,
4 timeout/hang, 5 an environment that cannot run what was asked (``openclaw-bench doctor``),
1 anything else (a crashed rank, named).

Consistency errors carry *who* and *where* (step, bucket, parameters, ranks) as plain fields so
they pickle across process boundaries and land verbatim in the run JSON's ``events``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_CHECK_FIRED = 3
EXIT_TIMEOUT = 4
EXIT_ENVIRONMENT = 5


class OpenClawError(Exception):
    """The project's errors. Those that name who and where keep them as plain fields
    (``_keep``), which survive pickling between processes (``Exception`` keeps only its
    positional arguments)."""

    exit_code = EXIT_FAILURE

    def _keep(self, detail: str, **fields: object) -> None:
        self.detail, self._fields = detail, fields
        self.__dict__.update(fields)

    def __reduce__(self):
        fields = self.__dict__.get("_fields")
        return super().__reduce__() if fields is None else (
            _rebuild, (type(self), self.detail, fields))


def _rebuild(cls: type[OpenClawError], detail: str, fields: dict) -> OpenClawError:
    return cls(detail, **fields)


class BadInput(OpenClawError, ValueError):
    """Invalid user input, raised before any process is spawned where possible."""

    exit_code = EXIT_BAD_INPUT


@dataclass
class Event:
    """One detected problem, as written to the run JSON's ``events`` list."""

    kind: str
    step: int | None
    ranks: list[int] = field(default_factory=list)
    bucket: int | None = None
    params: list[str] = field(default_factory=list)
    detail: str = ""

    def to_json(self) -> dict:
        return asdict(self)


class _Reported:
    """What an error that names who and where becomes in the run JSON's ``events``."""

    @property
    def kind(self) -> str:
        return type(self).__name__

    def event(self) -> Event:
        return Event(self.kind, self.step, self.ranks, getattr(self, "bucket", None),
                     getattr(self, "params", []), self.detail)


class ConsistencyError(_Reported, OpenClawError):
    """A rank-consistency check fired. Subclasses name the check."""

    exit_code = EXIT_CHECK_FIRED

    def __init__(self, detail: str, *, step: int | None = None, ranks: list[int] | None = None,
                 bucket: int | None = None, params: list[str] | None = None) -> None:
        self._keep(detail, step=step, ranks=sorted(ranks or []), bucket=bucket,
                   params=list(params or []))
        super().__init__(self._message())

    def _message(self) -> str:
        where = [f"step {self.step}"] if self.step is not None else []
        if self.bucket is not None:
            where.append(f"bucket {self.bucket}")
        if self.ranks:
            where.append(f"ranks {self.ranks}")
        params = ""
        if self.params:
            shown = ", ".join(self.params[:4]) + (" …" if len(self.params) > 4 else "")
            params = f" [params: {shown}]"
        return f"{self.kind} at {', '.join(where) or 'construction'}: {self.detail}{params}"

    def renumbered(self, ranks: list[int]) -> ConsistencyError:
        """The same error with group ranks mapped through ``ranks`` (group rank -> global
        rank): checks run on a DDP model's own process group, users read global ranks."""
        return type(self)(self.detail, step=self.step, ranks=[ranks[r] for r in self.ranks],
                          bucket=self.bucket, params=self.params)


class ClockMismatch(ConsistencyError):
    """Ranks reduced the same bucket at different logical steps (a rank ran ahead or behind)."""


class BucketMisalignment(ConsistencyError):
    """Ranks put different parameters into the same bucket slot (the seed's M3)."""


class ScaleMismatch(ConsistencyError):
    """Ranks pre-scaled FP16 gradients by different factors (the seed's M4); or, under FSDP2,
    scaled their reduced gradient shards by different factors before the optimizer step
    (clipping by each rank's local norm)."""


class ShapeMismatch(ConsistencyError):
    """Gradient manifests (names, shapes, dtypes, presence) differ between ranks."""


class MissingGradient(ConsistencyError):
    """A parameter the model declares always-used got no gradient on some ranks: DDP would
    zero-fill it and the average would silently lose that rank's contribution."""


class ParameterMismatch(ConsistencyError):
    """Parameter names, shapes, dtypes or order differ between ranks at construction."""


class GradientsNotAveraged(ConsistencyError):
    """A backward gave parameters gradients that DDP never averaged (``averaged.Cause``)."""


class ReplicaDivergence(ConsistencyError):
    """Parameters that must be bitwise equal on all ranks differ."""


class InputMismatch(ConsistencyError):
    """The tensor-parallel ranks of one data-parallel group were fed different inputs where the
    plan takes its input replicated over tp (``fsdp/inputs.py``)."""


class ComputeMismatch(ConsistencyError):
    """The compute canary (``canary.schedule``): every rank ran the same probe — the same
    parameters, input, dropout seed and cotangent — and some rank's gradients differ bitwise
    (or, once the start-up self-test found the ranks not bitwise reproducible, beyond the
    stated tolerance): that rank's hardware computes wrong (silent data corruption)."""


class NonFiniteGradient(ConsistencyError):
    """A NaN or inf gradient entered the sum that is not an FP16 overflow to be skipped."""


class OptimizerMismatch(ConsistencyError):
    """The optimizer that steps a hardened FSDP2 model holds none of its parameters (built
    before ``fully_shard``), or its hyperparameters differ between ranks (one rank's lr)."""


class CheckpointMismatch(ConsistencyError):
    """Ranks loaded a state dict into the hardened model a different number of times (a
    checkpoint loaded on one rank only): under FSDP2 each rank holds other shards, so nothing
    else can tell that one rank's shards come from another state."""


class CollectiveFailed(_Reported, OpenClawError):
    """A bucket's allreduce itself failed (the backend's own error, e.g. a peer rank that
    crashed, exited or ended early closed its connection): not a disagreement between ranks,
    so nothing was verified. ``ranks`` are the failed peers when the backend names them."""

    def __init__(self, detail: str, *, step: int | None = None, bucket: int | None = None,
                 ranks: list[int] | None = None) -> None:
        self._keep(detail, step=step, bucket=bucket, ranks=sorted(ranks or []))
        who = f", ranks {self.ranks}" if self.ranks else ""
        super().__init__(f"CollectiveFailed at step {step}, bucket {bucket}{who}: the "
                         f"allreduce failed (a peer rank crashed, exited or ended early?): "
                         f"{detail}")


class SyncTimeout(_Reported, OpenClawError):
    """A collective or a whole run passed its deadline; ``ranks`` are those that had not arrived."""

    exit_code = EXIT_TIMEOUT

    def __init__(self, detail: str, *, ranks: list[int] | None = None, step: int | None = None,
                 bucket: int | None = None) -> None:
        self._keep(detail, ranks=sorted(ranks or []), step=step, bucket=bucket)
        super().__init__(f"{detail} (late ranks: {self.ranks})")


class JobFailed(_Reported, OpenClawError):
    """This rank ends because the job failed elsewhere (``evidence/job_end.py``): a peer left
    its failure in the store (``rank``: that peer; ``ranks``: the ranks its error blames), or
    the store's host is gone (``rank`` None). ``exit_code``: the peer's (3 a check, 4 a
    timeout), else 1."""

    def __init__(self, detail: str, *, rank: int | None = None, ranks: list[int] | None = None,
                 step: int | None = None, exit_code: int = EXIT_FAILURE) -> None:
        self._keep(detail, rank=rank, ranks=sorted(ranks or []), step=step,
                   exit_code=exit_code)
        super().__init__(detail)


def backend_message(exc: BaseException) -> str:
    """The backend's own words for a failed collective, without the future's wrapping of a
    hook continuation."""
    text = str(exc).split("\n\nAt:")[0].strip()
    return text.removeprefix("Got the following error when running the callback: ")
