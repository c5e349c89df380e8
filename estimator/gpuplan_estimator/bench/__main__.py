"""``python -m gpuplan_estimator.bench`` (same as ``gpuplan bench`` / ``gpuplan import``)."""

import sys

from gpuplan_estimator.bench.cli import main

sys.exit(main())
