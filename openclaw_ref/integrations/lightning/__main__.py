"""``python -m openclaw_ref.integrations.lightning``: the runner (see ``runner.py``)."""

from openclaw_ref.integrations.lightning.runner import main

raise SystemExit(main())
