"""gpuplan-scheduler's HTTP extender: filters and scores GPU nodes for planned pods."""
