"""The estimator HTTP service and its wire types."""
