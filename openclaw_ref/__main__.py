from torch.distributed.elastic.multiprocessing.errors import record

from openclaw_ref.cli import main


@record
def _main() -> int:
    return main()


if __name__ == "__main__":
    raise SystemExit(_main())
