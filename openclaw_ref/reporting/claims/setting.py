"""Text 000's setting (§1): the hardware and software it ran on, and its dynamic sparse model.

These describe text 000, they are not results: S1 is always a *setting*, S2 says whether this
suite's model implements the sparse path text 000 describes.
"""

from __future__ import annotations

from openclaw_ref.reporting.claims.evidence import curve
from openclaw_ref.reporting.claims.judging import NOTHING
from openclaw_ref.reporting.claims.registry import INTERFACE, Family, Finding, Missing, Verdict
from openclaw_ref.reporting.record import RunRecord

FAMILY = Family()
claim = FAMILY.claim


@claim("S1", "Original setting: 8×A100-80GB (DGX-A100), global batch 256, DDP, PyTorch 2.1.0, "
       "NCCL 2.13.4, CUDA 12.1", source="text 000 §1", outcomes=(Verdict.SETTING,))
def differences_from_seed_setting(rec: RunRecord) -> Finding:
    """A setting, not a result: lists how this environment differs from text 000's."""
    env = rec.environment
    diffs = []
    if env.gpu_count < 8 or not any("A100" in m for m in env.gpu_models):
        diffs.append(f"{env.gpu_count} GPUs instead of 8×A100-80GB")
    if env.backend != "nccl" or env.nccl != "2.13.4":
        diffs.append(f"backend {env.backend}, NCCL {env.nccl or 'none'} instead of NCCL 2.13.4")
    if not env.torch.startswith("2.1."):
        diffs.append(f"torch {env.torch} instead of 2.1.0")
    if env.cuda != "12.1":
        diffs.append(f"CUDA {env.cuda or 'none'} instead of 12.1")
    gb = rec.config.get("global_batch")
    if gb != 256:
        diffs.append(f"global batch {gb} instead of 256")
    return Finding(Verdict.SETTING, "—", f"here: {env.describe()}; differs: "
                   + ("; ".join(diffs) if diffs else "nothing"), command=NOTHING)


@claim("S2", "Dynamic sparse path, sparsity ratio in [0.12, 0.68], a SparseGatingUnit; "
       "parameters such as layer.3.attn.v_proj.weight, layer.5.ffn.w1",
       source="text 000 §1, §2.2",
       outcomes=INTERFACE)
def sparse_path_is_dynamic_with_seed_names(rec: RunRecord) -> Finding:
    """Implemented if the realized masked fraction stays in [0.12, 0.68] (±0.03), spans at
    least half that range (the path is dynamic), and text 000's parameter names were recorded."""
    c = curve(rec)
    sp = c.get("realized_sparsity") or []
    if not sp:
        raise Missing("realized sparsity not recorded")
    lo, hi = min(sp), max(sp)
    names = ("layer.3.attn.v_proj.weight", "layer.5.ffn.w1.weight")
    absent = [n for n in names if n not in (c.get("grad_norms") or {})]
    in_range = 0.12 - 0.03 <= lo and hi <= 0.68 + 0.03 and hi - lo >= 0.28
    text = (f"realized masked fraction {lo:.3f}–{hi:.3f} over {len(sp)} steps; text 000's "
            f"parameter names recorded: {', '.join(n for n in names if n not in absent) or 'none'}")
    ran = "the curve run's per-step sparsity and gradient names"
    if in_range and not absent:
        return Finding(Verdict.IMPLEMENTED, ran, text)
    why = "; ".join(filter(None, ["" if in_range else "sparsity outside/narrower than text 000's",
                                  f"absent: {', '.join(absent)}" if absent else ""]))
    return Finding(Verdict.NOT_IMPLEMENTED, ran, text, why)
