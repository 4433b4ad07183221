"""Where the bundled fixtures live (the repo's fixtures/, or $BLOOMERY_FIXTURES)."""

from __future__ import annotations

import os
from pathlib import Path

FIXTURES = Path(os.environ.get("BLOOMERY_FIXTURES", Path(__file__).resolve().parent.parent / "fixtures"))
PROMPTS = FIXTURES / "prompts.jsonl"
