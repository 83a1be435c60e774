"""``python -m openclaw_ref.bench`` (see ``cli.py``)."""

from openclaw_ref.bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
