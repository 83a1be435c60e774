"""The captioned tables of the ``tp_corpus`` section: FSDP2 × tensor parallel, healthy set-ups
and published TP/SP mistakes, the script as written (stock) beside ``harden()``'s defaults —
per mesh, what each column ended in (named at which step, which ranks and parameters), and
the silent drift stock leaves in the replicated parameters. Every word is written here, from
the figures the section stored."""

from __future__ import annotations

from openclaw_ref.reporting.fsdp_tables import fsdp_corpus_cell
from openclaw_ref.reporting.table import Figures, Table

TP_COLUMN_TITLES = {"stock": "stock (as written)", "hardened": "harden() defaults"}
SHOWN_PARAMS = 2  # parameters named in a cell; the rest counted
REFUSED = "BadInput"  # harden() refused the model before any step


def _mesh(mesh: str, world: int) -> str:
    if mesh.startswith("replicate"):
        return f"the 3-D mesh (replicate=2, shard=2, tp=2: HSDP × TP) on {world} gloo ranks"
    return f"the 2-D mesh (dp=2, tp=2) on {world} gloo ranks"


def _params(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN_PARAMS])
    more = len(names) - SHOWN_PARAMS
    return shown + (f" +{more}" if more > 0 else "")


def _quiet(c: Figures) -> str:
    """A run that trained: bitwise as stock (hardened healthy cases) and its warnings."""
    said = []
    if c.get("bitwise_equal_to_stock") is not None:
        said.append("bitwise = stock" if c["bitwise_equal_to_stock"] else "NOT bitwise = stock")
    if c["warned_ranks"]:
        said.append(f"warned ×{c['warnings_per_rank']} on {len(c['warned_ranks'])} ranks")
    else:
        said.append("no warning")
    return "; ".join(said)


def tp_cell(c: Figures, healthy: bool) -> str:
    """An outcome in words: a healthy run trains (or is a false alarm); a mistake is named
    (error, step, ranks, parameters), refused, silent (the replica drift and the parameters
    that drifted, or equal replicas off the correct run), or crashes or hangs."""
    kind = c["outcome"]
    if kind == "no-effect":
        return f"trains ({_quiet(c)})" if healthy else f"no-effect ({_quiet(c)})"
    if kind == "silent-corruption":
        if c["drift"]:
            return (f"silent: replicas drift {c['drift']:.1e} "
                    f"({_params(c['drift_params'])})")
        off = "" if c["from_base"] is None else f"; {c['from_base']:.1e} off the correct run"
        return f"silent: replicas equal{off}"
    if c.get("error") == REFUSED and kind == "crash":
        return f"refused ({REFUSED} at harden())"
    cell = fsdp_corpus_cell(c)
    if kind == "detected" and healthy:
        cell = "false alarm" + cell[len("detected"):]
    return cell + (f"; {_params(c['params'])}" if c.get("params") else "")


def _source(p: Figures) -> str:
    if p["healthy"]:
        return "— (healthy)"
    return f"[{p['source']}]({p['url']})" if p.get("url") else p["source"]


def _caption(st: Figures, mesh: str, world: int, rows: list[Figures], cell: dict,
             columns: list[str]) -> str:
    mistakes = [p["name"] for p in rows if not p["healthy"]]
    healthy = [p["name"] for p in rows if p["healthy"]]
    caught = {col: sum(cell.get((n, col), {}).get("outcome") == "detected" for n in mistakes)
              for col in columns}
    quiet = {col: sum(cell.get((n, col), {}).get("outcome") == "no-effect"
                      and not cell[(n, col)]["warned_ranks"] for n in healthy)
             for col in columns}
    return (
        "FSDP2 × tensor parallel as plain user scripts (openclaw_ref/tp_corpus/: a 2-block "
        "model, LayerNorm → Linear → ReLU → Linear with a residual, an input projection, a "
        "final norm and a classifier head; parallelize_module over tp, then fully_shard over "
        f"the data-parallel dims; AdamW), each a {st['steps']}-step run under torchrun on "
        f"{_mesh(mesh, world)} × 1 thread. A mistake acts on every rank's code, or on rank "
        f"{st['fault_rank']} alone from step {st['fault_step']}; process-group timeout "
        f"{st['timeout_s']:.0f} s. stock = the script as written; harden() defaults = "
        "harden(model) right after the last fully_shard. Outcome: trains (healthy: bitwise = "
        "stock: the same parameters bit for bit on every rank; warned: the warnings printed "
        "per rank) / detected (the error raised, its step, the ranks and parameters it named)"
        " / false alarm (a healthy job stopped) / refused (harden() raised BadInput before "
        "any step) / silent (replicas drift: the largest spread of a replicated parameter "
        "over its copies at the end, and which; replicas equal: every copy agrees, yet the "
        "run differs from its healthy base by the given largest absolute Δ) / hang-timeout / "
        "crash. "
        "Caught: " + ", ".join(f"{TP_COLUMN_TITLES.get(c, c)} {caught[c]} of "
                               f"{len(mistakes)}" for c in columns)
        + "; healthy and quiet (no error, no warning): "
        + ", ".join(f"{TP_COLUMN_TITLES.get(c, c)} {quiet[c]} of {len(healthy)}"
                    for c in columns) + ".")


def tp_outcome_tables(sec: Figures) -> list[Table]:
    """One table per mesh: case | public source | one column per column run."""
    st, sources, cases = sec["settings"], sec["cases_run"], sec["cases"]
    tables = []
    for mesh, world in dict.fromkeys((c["mesh"], c["world_size"]) for c in cases):
        rows = [p for p in sources if p["mesh"] == mesh]
        here = [c for c in cases if c["mesh"] == mesh]
        columns = list(dict.fromkeys(c["column"] for c in here))
        cell = {(c["case"], c["column"]): c for c in here}
        tables.append(Table(
            _caption(st, mesh, world, rows, cell, columns),
            ["case", "public source"] + [TP_COLUMN_TITLES.get(c, c) for c in columns],
            [[p["name"], _source(p)]
             + [tp_cell(cell[(p["name"], c)], p["healthy"]) if (p["name"], c) in cell else ""
                for c in columns] for p in rows]))
    return tables


def tp_drift_table(sec: Figures) -> Table:
    """The stock column's mistakes: how far the replicated parameters drifted apart, which,
    and how far the run ended from its healthy base — what no error reported."""
    stock = {(c["case"], c["mesh"]): c for c in sec["cases"] if c["column"] == "stock"}
    rows = []
    for p in sec["cases_run"]:
        c = stock.get((p["name"], p["mesh"]))
        if p["healthy"] or c is None:
            continue
        rows.append([p["name"], p["mesh"], c["outcome"],
                     "—" if c["drift"] is None else f"{c['drift']:.3g}",
                     str(len(c["drift_params"])), _params(c["drift_params"]) or "—",
                     "—" if c["from_base"] is None else f"{c['from_base']:.3g}",
                     p["base"]])
    return Table(
        f"What stock left behind after {sec['settings']['steps']} steps, per mistake: the "
        "replica drift (the largest spread of any element of a replicated parameter over the "
        "ranks holding it: a parameter TP replicates, or one the plan left out, is the same on "
        "every rank of its replica group in a correct job), how many parameters drifted and "
        "which, and the largest absolute Δ of any parameter from the same column's healthy "
        "base run (— where the base ran in another torchrun job or the run did not finish). "
        "Stock printed no error and no warning for any silent one.",
        ["case", "mesh", "stock outcome", "replica drift", "params drifted", "which",
         "max Δ from the base run", "base"], rows)


def tp_corpus_tables(sec: Figures, cfg: Figures) -> list[Table]:
    return [*tp_outcome_tables(sec), tp_drift_table(sec)]
