"""``openclaw-bench doctor``: what this machine can run, and what in its environment is wrong.

Why: the seed's fixes (F4) and prevention (P1) are environment settings, and two of its NCCL
variables do not do what it says (``NCCL_RING_ALGO`` does not exist; ``NCCL_MIN_NRINGS`` is the
legacy name of ``NCCL_MIN_NCHANNELS``). A setting that NCCL silently ignores is worse than none:
the user believes a fix is in place. The doctor names the current equivalent of each.

Verdict and exit status (``doctor_exit_code``):
  * ``error``   — a setting that has no effect or is invalid, or a refused configuration (NCCL
                  older than 2.13.4 for the NCCL backend, the seed's P1): exit 5, the
                  project's environment-error code (2 stays "bad input": a flag the doctor
                  itself cannot parse);
  * ``warning`` — a deprecated alias that is still honoured, or a known pitfall: exit 0, or 5
                  with ``--strict``;
  * ``info``    — facts worth printing (e.g. no NCCL here, gloo will be used): never fails.

Everything that decides a verdict is a pure function of its inputs (an environment mapping, a
version) so it is tested without GPUs; only ``probe_facts`` looks at the machine.
"""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from openclaw_ref.sync.errors import EXIT_ENVIRONMENT, EXIT_OK

NCCL_FLOOR: tuple[int, int, int] = (2, 13, 4)  # seed P1: older NCCL claimed to lose allreduces
LEVELS = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One verdict line: ``code`` is stable (for scripts), ``message`` is for people."""

    level: str  # error | warning | info
    code: str
    message: str
    variable: str | None = None
    replacement: str | None = None  # the current equivalent, where there is one

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}; got {self.level!r}")


# ---------------------------------------------------------------------------------------------
# NCCL version floor (seed P1)


def parse_nccl_version(version: object) -> tuple[int, int, int] | None:
    """Normalise what torch and NCCL report: a tuple ``(2, 13, 4)``, a string ``"2.13.4"`` (with
    an optional suffix such as ``+cuda12.1``), or NCCL's integer code — ``major*10000 +
    minor*100 + patch`` since 2.9 (21304), ``major*1000 + minor*100 + patch`` before (2708).
    None or an unparsable value gives None."""
    if version is None:
        return None
    if isinstance(version, (tuple, list)):
        parts = [int(x) for x in version[:3]]
        return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]
    if isinstance(version, int):
        if version >= 10000:
            return version // 10000, (version // 100) % 100, version % 100
        return version // 1000, (version // 100) % 10, version % 100
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if not m:
        return None
    return int(m[1]), int(m[2]), int(m[3] or 0)


def format_version(v: tuple[int, int, int]) -> str:
    return ".".join(map(str, v))


def nccl_version_findings(version: object, backend: str) -> list[Finding]:
    """Refuse the NCCL backend below ``NCCL_FLOOR``; ``backend`` is auto|nccl|gloo.

    ``auto`` means "NCCL if the GPUs are there": it is refused only when an NCCL is present
    and too old (without NCCL, auto falls back to gloo, which is reported as info)."""
    v = parse_nccl_version(version)
    floor = format_version(NCCL_FLOOR)
    if backend == "gloo":
        return []
    if v is None:
        if backend == "nccl":
            return [Finding("error", "nccl-missing",
                            "backend nccl requested but this torch has no usable NCCL "
                            "(CPU build or no GPU); use --backend gloo")]
        return [Finding("info", "nccl-missing", "no NCCL here: backend auto will use gloo")]
    if v < NCCL_FLOOR:
        return [Finding("error", "nccl-too-old",
                        f"NCCL {format_version(v)} is older than {floor}: refused for the NCCL "
                        "backend (text 000's P1; older releases were reported to lose allreduces). "
                        f"Install a torch built with NCCL >= {floor}, or use --backend gloo")]
    return [Finding("info", "nccl-ok", f"NCCL {format_version(v)} >= {floor}")]


# ---------------------------------------------------------------------------------------------
# Environment lint (seed F4 and the pitfalls measured in torch-facts)


def lint_environment(env: Mapping[str, str]) -> list[Finding]:
    """Findings for the NCCL/torch variables in ``env``, in a stable order.

    Each rule names the variable and its current equivalent. Only variables known to be wrong
    are reported: NCCL has hundreds of knobs and an allow-list would go stale."""
    out: list[Finding] = []
    if "NCCL_RING_ALGO" in env:
        out.append(Finding(
            "error", "not-an-nccl-variable",
            f"NCCL_RING_ALGO={env['NCCL_RING_ALGO']!r} is not an NCCL variable and is silently "
            "ignored; to force the ring algorithm set NCCL_ALGO=Ring",
            "NCCL_RING_ALGO", "NCCL_ALGO=Ring"))
    for legacy, current in (("NCCL_MIN_NRINGS", "NCCL_MIN_NCHANNELS"),
                            ("NCCL_MAX_NRINGS", "NCCL_MAX_NCHANNELS")):
        if legacy in env:
            shadowed = f"; {current} is also set and takes precedence" if current in env else ""
            out.append(Finding(
                "warning", "deprecated-nccl-variable",
                f"{legacy} is the legacy name of {current} (still read by NCCL, but {current} "
                f"wins when both are set){shadowed}; rename it to {current}={env[legacy]}",
                legacy, current))
    if "NCCL_BUFFSIZE" in env:
        value = env["NCCL_BUFFSIZE"].strip()
        if not value:
            out.append(Finding(
                "error", "empty-nccl-variable",
                "NCCL_BUFFSIZE is set but empty: NCCL ignores it and uses its default (4 MiB); "
                "set bytes explicitly, e.g. NCCL_BUFFSIZE=2097152 for text 000's 2 MB",
                "NCCL_BUFFSIZE", "NCCL_BUFFSIZE=<bytes>"))
        elif not re.fullmatch(r"\d+", value):
            out.append(Finding(
                "error", "invalid-nccl-variable",
                f"NCCL_BUFFSIZE={value!r} is not a byte count (NCCL ignores it); "
                "use an integer, e.g. 2097152 for 2 MiB",
                "NCCL_BUFFSIZE", "NCCL_BUFFSIZE=<bytes>"))
    if "NCCL_ASYNC_ERROR_HANDLING" in env:
        out.append(Finding(
            "warning", "deprecated-torch-variable",
            "NCCL_ASYNC_ERROR_HANDLING is torch's deprecated name (still read, with a warning); "
            f"use TORCH_NCCL_ASYNC_ERROR_HANDLING={env['NCCL_ASYNC_ERROR_HANDLING']}",
            "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"))
    if env.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL":
        out.append(Finding(
            "warning", "ddp-detail-on-gloo",
            "TORCH_DISTRIBUTED_DEBUG=DETAIL makes the DDP constructor segfault on gloo with "
            "torch 2.13 (measured); use INFO, or set dist.set_debug_level(DETAIL) after "
            "init_process_group", "TORCH_DISTRIBUTED_DEBUG", "TORCH_DISTRIBUTED_DEBUG=INFO"))
    return out


# ---------------------------------------------------------------------------------------------
# Facts about this machine, and the whole report


@dataclass
class DoctorReport:
    facts: dict
    findings: list[Finding] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        levels = {f.level for f in self.findings}
        return "error" if "error" in levels else "warning" if "warning" in levels else "ok"

    def to_json(self) -> dict:
        return {"facts": self.facts, "verdict": self.verdict,
                "findings": [asdict(f) for f in self.findings]}


def probe_facts() -> dict:
    """Versions and devices of this machine (imports torch; may initialise CUDA)."""
    import torch
    import torch.distributed as dist

    from openclaw_ref.core.environment import nccl_version_text

    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": cuda,
        "gpu_count": len(gpus),
        "gpu_models": sorted(set(gpus)),
        "distributed_available": dist.is_available(),
        "gloo_available": dist.is_available() and dist.is_gloo_available(),
        "nccl_available": dist.is_available() and dist.is_nccl_available(),
        "nccl_version": nccl_version_text(),
        "lightning": _module_version("lightning"),
        "prometheus_client": _module_version("prometheus_client"),
    }


def _module_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def diagnose(facts: Mapping, env: Mapping[str, str], backend: str = "auto") -> DoctorReport:
    """The verdict for given facts and environment (pure: no machine access)."""
    findings = lint_environment(env)
    if not facts.get("gloo_available"):
        findings.append(Finding("warning" if backend == "nccl" else "error", "gloo-missing",
                                "this torch has no gloo backend: CPU runs and tests cannot work"))
    findings.extend(nccl_version_findings(
        facts.get("nccl_version") if facts.get("nccl_available") else None, backend))
    order = {lvl: i for i, lvl in enumerate(LEVELS)}
    return DoctorReport(dict(facts), sorted(findings, key=lambda f: order[f.level]))


def doctor_exit_code(report: DoctorReport, strict: bool = False) -> int:
    """0 when nothing is wrong (warnings allowed unless ``strict``), 5 (an environment error)
    otherwise."""
    if report.verdict == "error" or (strict and report.verdict == "warning"):
        return EXIT_ENVIRONMENT
    return EXIT_OK


def render(report: DoctorReport) -> str:
    from tabulate import tabulate

    def show(v: object) -> str:
        if v is None:
            return "-"
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, list):
            return ", ".join(map(str, v)) or "-"
        return str(v)

    lines = [tabulate([(k, show(v)) for k, v in report.facts.items()], tablefmt="plain"), ""]
    for f in report.findings:
        lines.append(f"{f.level.upper():8s}{f.message}")
    lines.append(f"verdict: {report.verdict}")
    return "\n".join(lines)


def run_doctor(backend: str = "auto", strict: bool = False, as_json: bool = False,
               env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """Text (or JSON) to print and the exit status."""
    report = diagnose(probe_facts(), os.environ if env is None else env, backend)
    text = json.dumps(report.to_json(), indent=2) if as_json else render(report)
    return text, doctor_exit_code(report, strict)


__all__: Sequence[str] = (
    "NCCL_FLOOR", "Finding", "DoctorReport", "parse_nccl_version", "nccl_version_findings",
    "lint_environment", "probe_facts", "diagnose", "doctor_exit_code", "render", "run_doctor",
)
