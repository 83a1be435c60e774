"""One rank of a real ``accelerate launch`` job: the Accelerate loop of
``tests/test_accelerate_client.py`` with Accelerate initialising the process group itself
(``env://`` from the launcher's ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``), hardened after
``prepare``. Each rank writes what it saw to ``OUT/rank<r>.json`` (its weights exactly, as
float hex).

    accelerate launch --multi_gpu --num_processes 2 --main_process_ip 127.0.0.1 \\
        -m tests.accelerate_launched --out DIR [--canary-every K] [--fault NAME --value V]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from accelerate import Accelerator

from tests.test_accelerate_client import ACCUMULATE, AccelerateRun, train_under


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--canary-every", type=int, default=0)
    p.add_argument("--fault", default="")
    p.add_argument("--value", default="")
    args = p.parse_args()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    reply = train_under(acc, AccelerateRun(canary_every=args.canary_every, fault=args.fault,
                                           value=args.value))
    reply["weights"] = [v.hex() for w in reply["weights"] for v in w.reshape(-1).tolist()]
    reply["world_size"] = acc.num_processes
    (args.out / f"rank{acc.process_index}.json").write_text(json.dumps(reply))


if __name__ == "__main__":
    main()
