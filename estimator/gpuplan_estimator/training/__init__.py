"""Fitting latency-model bundles from measurements: the fit, its report, the shipped recipe."""
