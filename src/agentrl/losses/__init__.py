"""Policy losses (registered by name), the KL estimator, loss aggregation and auxiliary losses."""
