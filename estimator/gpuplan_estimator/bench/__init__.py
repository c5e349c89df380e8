"""`gpuplan bench`: sample single-kernel configurations, time them, store measurement rows."""
