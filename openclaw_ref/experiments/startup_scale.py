"""What the start-up (construction) check exchanges per rank as the job grows to thousands of
ranks — arithmetic from the sizes the code itself produces, not a measured run.

Before: every rank's ``(digest, manifest, layout)`` went through ``all_gather_object``: an int64
length per rank, then every rank's pickle padded to the longest — O(W × manifest) on every rank.
Now (``sync.checks.construction_check``): one tensor gather of ``DIGEST_BYTES`` per rank; only
on a mismatch the lengths and the encoded manifests (JSON, zlib-compressed) follow.
"""

from __future__ import annotations

import pickle
import zlib

from openclaw_ref.sync.evidence.checks import DIGEST_BYTES, Manifest, encode_manifest

WORLD_SIZES = (8, 64, 1024, 8192)
MANIFEST_BYTES = 200_000
LENGTH_BYTES = 8  # the int64 length each rank contributes before a variable-size gather
OLD_DIGEST = "0" * 64  # the SHA-256 hex digest the old gather carried beside the manifest


def pickled_bytes(manifest: Manifest, layout: list[int] | None = None) -> int:
    """What ``all_gather_object`` sent per rank before: the pickled (digest, manifest, layout)."""
    return len(pickle.dumps((OLD_DIGEST, manifest, layout)))


def synthesized_manifest(target_bytes: int = MANIFEST_BYTES) -> Manifest:
    """A transformer-like manifest that the old gather sent as at least ``target_bytes``."""
    kinds = [("attn.q_proj.weight", (4096, 4096)), ("attn.k_proj.weight", (4096, 4096)),
             ("attn.v_proj.weight", (4096, 4096)), ("attn.o_proj.weight", (4096, 4096)),
             ("mlp.up_proj.weight", (11008, 4096)), ("mlp.down_proj.weight", (4096, 11008)),
             ("norm.weight", (4096,))]
    manifest: Manifest = []
    layer = 0
    while pickled_bytes(manifest) < target_bytes:
        manifest += [(f"model.layers.{layer}.{k}", s, "torch.bfloat16") for k, s in kinds]
        layer += 1
    return manifest


def exchange_bytes(world_size: int, manifest: Manifest,
                   layout: list[int] | None = None) -> dict[str, int]:
    """Bytes each rank receives at start-up with ``world_size`` equal manifests: ``before``
    (all_gather_object of the pickled triple), ``after_clean`` (the digests), and
    ``after_mismatch`` (digests, lengths, compressed encoded manifests)."""
    pickled = pickled_bytes(manifest, layout)
    encoded = len(zlib.compress(encode_manifest(manifest, layout)))
    return {"world_size": world_size,
            "pickled_bytes": pickled,
            "compressed_bytes": encoded,
            "before": world_size * (LENGTH_BYTES + pickled),
            "after_clean": world_size * DIGEST_BYTES,
            "after_mismatch": world_size * (DIGEST_BYTES + LENGTH_BYTES + encoded)}


def measure(world_sizes=WORLD_SIZES, target_bytes: int = MANIFEST_BYTES) -> list[dict[str, int]]:
    manifest = synthesized_manifest(target_bytes)
    return [exchange_bytes(w, manifest) for w in world_sizes]

