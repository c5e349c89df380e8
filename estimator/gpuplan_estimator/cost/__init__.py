"""Pricing work items on a device: the predictor protocol, the roofline, feature rows."""
