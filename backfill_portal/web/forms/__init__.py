"""Web forms: shape only; the services decide."""
