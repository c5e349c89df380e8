"""``python -m gpuplan_estimator.interfaces.cli`` (the same as the `gpuplan` command)."""

import sys

from gpuplan_estimator.interfaces.cli.main import main

sys.exit(main())
