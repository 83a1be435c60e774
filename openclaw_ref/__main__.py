from torch.distributed.elastic.multiprocessing.errors import record

from openclaw_ref.cli import main
from openclaw_ref.core.launch import exit_process


@record
def _main() -> int:
    return main()


if __name__ == "__main__":
    exit_process(_main())
