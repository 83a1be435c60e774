"""``python -m openclaw_ref``: the ``openclaw-bench`` entry point. Under torchrun (whose agent
names each rank's ``TORCHELASTIC_ERROR_FILE``) a failed rank's error is recorded there by
torch's ``record``; torch is imported only then, so ``--help`` stays fast."""

import os

from openclaw_ref.cli import console_main, main


def _recorded_main() -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(main)()


if __name__ == "__main__":
    console_main(_recorded_main if "TORCHELASTIC_ERROR_FILE" in os.environ else main)
