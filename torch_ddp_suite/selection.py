"""Which of PyTorch's distributed tests are DDP tests, and which of those can run here.

A DDP test: a ``test_*`` method of ``DistributedTest._DistTestBase`` whose body, or a
``self._helper(...)`` it calls (followed transitively), constructs ``DistributedDataParallel``
or names DDP. Read from the module's source with ``ast``: nothing is run to decide.

Each is ``runnable`` here, or not run with the reason: PyTorch skips it itself on this set-up
(``unittest.skip*`` / ``skip_but_pass_in_sandcastle_if`` evaluated at import, read from the
method's ``__unittest_skip__``), or it is gated on GPUs (``skip_if_lt_x_gpu``,
``skip_if_no_gpu``, ``require_backend_is_available(...['gpu'])``: each exits as skipped in its
ranks without CUDA, after a spawn that costs ~30 s here). With CUDA present the GPU-gated tests
are runnable too.
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
from dataclasses import dataclass

GPU_GATES = ("skip_if_lt_x_gpu", "skip_if_no_gpu", "backend_feature['gpu']",
             'backend_feature["gpu"]', "require_n_gpus")
DDP_WORDS = re.compile(r"ddp|distributeddataparallel", re.IGNORECASE)
HELPER_CALL = re.compile(r"self\.(_\w+)\(")


class Status(enum.StrEnum):
    RUNNABLE = "runnable"
    SKIPPED_BY_PYTORCH = "skipped by PyTorch"
    NEEDS_GPU = "needs a GPU"


@dataclass(frozen=True)
class Selected:
    name: str
    status: Status
    why: str = ""


def _methods(source: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(source)
    base = next(n for n in ast.walk(tree)
                if isinstance(n, ast.ClassDef) and n.name == "_DistTestBase")
    return {n.name: n for n in base.body if isinstance(n, ast.FunctionDef)}


def _names_ddp(name: str, methods: dict[str, ast.FunctionDef], seen: set[str]) -> bool:
    if name in seen or name not in methods:
        return False
    seen.add(name)
    body = ast.unparse(methods[name])
    if DDP_WORDS.search(body):
        return True
    return any(_names_ddp(h, methods, seen) for h in set(HELPER_CALL.findall(body)))


def ddp_tests(base: type, cuda: bool) -> list[Selected]:
    """Every DDP test of ``base`` (``_DistTestBase``), in source order, with its status."""
    methods = _methods(inspect.getsource(inspect.getmodule(base)))
    selected = []
    for name, node in methods.items():
        if not name.startswith("test_") or not _names_ddp(name, methods, set()):
            continue
        fn = getattr(base, name)
        gates = [ast.unparse(d) for d in node.decorator_list
                 if any(g in ast.unparse(d) for g in GPU_GATES)]
        if getattr(fn, "__unittest_skip__", False):
            selected.append(Selected(name, Status.SKIPPED_BY_PYTORCH,
                                     str(getattr(fn, "__unittest_skip_why__", ""))))
        elif gates and not cuda:
            selected.append(Selected(name, Status.NEEDS_GPU, gates[0]))
        else:
            selected.append(Selected(name, Status.RUNNABLE))
    return selected
