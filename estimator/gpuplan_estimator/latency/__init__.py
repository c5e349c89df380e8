"""Learned latency: LightGBM kernel models, bundles and predictor selection.

The only package that imports lightgbm.
"""
