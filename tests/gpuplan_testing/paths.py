"""Where the tests find the repository and the shared measured data."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("GPUPLAN_SHARED_DATA") or REPO_ROOT.parent / "shared" / "data")
"""``$GPUPLAN_SHARED_DATA``, else ``../shared/data`` beside the checkout (as `gpuplan train`)."""
