"""`python -m gpuplan_operator.extender --kubeconfig … --port 8888`."""

import sys

from gpuplan_operator.extender.cli import main

sys.exit(main())
