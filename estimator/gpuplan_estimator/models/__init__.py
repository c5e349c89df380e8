"""Learned latency: LightGBM kernel models, bundles and predictor selection (the only lightgbm user)."""
