"""Estimates per device, calibration from outcomes, data-parallel scaling and placement."""
