"""Where the work runs: ``--tp`` (the target over several processes) and ``--draft-device``."""
