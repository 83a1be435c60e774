"""What every guard exchanges and checks, whatever the wrapper: the control block and its counts,
the ledger, the replica digest and slices, the one vote, the watchdog, the precision policy."""
